"""Run untrusted Python in a subprocess with limits: the `python` tool and the `code_tests` reward
(a leaf module, imports nothing of reinforge, so agents/ and rewards/ both import it downward).

What is enforced (Linux; no root needed):
- wall time: the child runs in its own session (process group); past `timeout_s` the whole group
  is killed (SIGKILL). RLIMIT_CPU (timeout + 1 s) backs it up.
- memory: RLIMIT_AS (address space) of `memory_mb`; an allocation past it raises MemoryError
  in the child.
- files: a fresh temporary directory is the working directory, HOME and TMPDIR, and is deleted
  afterwards; RLIMIT_FSIZE caps any file written (stdout and stderr included) at
  MAX_FILE_BYTES; output returned to the caller is cut at `max_output_chars`.
- environment: scrubbed to PATH, HOME, TMPDIR, LANG; Python runs with -I (no user site, PYTHON*
  variables ignored).
- network: when `unshare -rn` (or `unshare -n`) works on this machine, the child runs in a new
  network namespace with no interface but loopback: no connection can leave the machine.
  Otherwise (network_isolation() == "socket-guard") the child's `socket` module is patched to
  raise before user code runs: that stops ordinary library code, not a determined adversary
  (ctypes can still reach the kernel).

This is a guard for reward code and tools on a research machine, not a security boundary for
hostile code: run that inside a container or VM with the network off.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

MAX_FILE_BYTES = 4 * 2**20

# Runs in the child before the user's code: limits, then the socket guard, then the code as
# __main__. Limits are set here (not in a preexec_fn) because preexec_fn is unsafe in a parent
# with threads, and tool calls run concurrently on threads.
_RUNNER = r'''
import json, resource, runpy, sys
cfg = json.loads(sys.argv[1])
for name, value in (("RLIMIT_AS", cfg["memory_bytes"]), ("RLIMIT_CPU", cfg["cpu_s"]),
                    ("RLIMIT_FSIZE", cfg["file_bytes"]), ("RLIMIT_CORE", 0)):
    resource.setrlimit(getattr(resource, name), (value, value))
if cfg["guard_socket"]:
    import socket, _socket
    def _refuse(*args, **kwargs):
        raise OSError("network access is disabled in the reinforge sandbox")
    for mod in (socket, _socket):
        for attr in ("socket", "create_connection", "getaddrinfo", "socketpair", "fromfd", "create_server"):
            if hasattr(mod, attr):
                setattr(mod, attr, _refuse)
del json, resource, cfg
sys.argv = ["main.py"]
runpy.run_path("main.py", run_name="__main__")
'''


@dataclass(frozen=True)
class SandboxResult:
    """stdout/stderr (each cut at max_output_chars, `truncated` says whether either was);
    returncode (negative: killed by that signal); timed_out when the wall limit killed it."""

    stdout: str
    stderr: str
    returncode: int
    timed_out: bool
    truncated: bool
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


@functools.lru_cache(maxsize=1)
def _unshare_prefix() -> tuple[str, ...]:
    """The command prefix that puts a child in a new network namespace, or () when none works."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return ()
    for flags in ("-rn", "-n"):
        try:
            done = subprocess.run([unshare, flags, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return (unshare, flags)
    return ()


def network_isolation() -> str:
    """"namespace" when children run in a network namespace of their own, else "socket-guard"."""
    return "namespace" if _unshare_prefix() else "socket-guard"


def _read(path: str, limit: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(4 * limit + 4)  # UTF-8 is at most 4 bytes a character
    text = data.decode("utf-8", errors="replace")
    return (text[:limit], True) if len(text) > limit else (text, False)


def run_python(code: str, *, stdin: str = "", files: dict[str, str] | None = None, timeout_s: float = 5.0,
               memory_mb: int = 512, max_output_chars: int = 4000) -> SandboxResult:
    """Run `code` as a script (main.py) in a fresh temp dir with the limits in the module doc.

    `files` are written into the temp dir first (name -> text). Never raises for anything the
    code does; OSError only if the sandbox itself cannot start (no temp dir, no interpreter).
    """
    work = tempfile.mkdtemp(prefix="reinforge-sandbox-")
    try:
        run_dir, out_dir = os.path.join(work, "run"), os.path.join(work, "out")
        os.mkdir(run_dir)
        os.mkdir(out_dir)  # outside the cwd, so the code does not find its own output files
        for name, text in {**(files or {}), "main.py": code}.items():
            with open(os.path.join(run_dir, name), "w", encoding="utf-8") as f:
                f.write(text)
        cfg = {"memory_bytes": int(memory_mb) * 2**20, "cpu_s": int(timeout_s) + 1, "file_bytes": MAX_FILE_BYTES,
               "guard_socket": not _unshare_prefix()}
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": run_dir, "TMPDIR": run_dir, "LANG": "C.UTF-8"}
        argv = [*_unshare_prefix(), sys.executable, "-I", "-c", _RUNNER, json.dumps(cfg)]
        out_path, err_path = os.path.join(out_dir, "stdout"), os.path.join(out_dir, "stderr")
        t0 = time.perf_counter()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(argv, cwd=run_dir, env=env, stdin=subprocess.PIPE, stdout=out, stderr=err,
                                    start_new_session=True)
            timed_out = False
            try:
                proc.communicate(stdin.encode("utf-8"), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc)
        wall = time.perf_counter() - t0
        stdout, cut_out = _read(out_path, max_output_chars)
        stderr, cut_err = _read(err_path, max_output_chars)
        return SandboxResult(stdout, stderr, proc.returncode, timed_out, cut_out or cut_err, wall)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group (a child may have forked), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
