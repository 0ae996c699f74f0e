"""The sandbox: each limit stops what it should, and the temp dir goes away."""
from __future__ import annotations

import glob
import os
import tempfile

from reinforge.sandbox import MAX_FILE_BYTES, network_isolation, run_python


def test_runs_code_with_stdin_and_files_in_a_fresh_dir():
    done = run_python("import os, sys\nprint(open('data.txt').read(), sys.stdin.read(), os.getcwd())",
                      stdin="from stdin", files={"data.txt": "from file"})
    assert done.ok and not done.truncated
    cwd = done.stdout.split()[-1]
    assert done.stdout.startswith("from file from stdin ") and "reinforge-sandbox-" in cwd
    assert not os.path.exists(cwd)  # removed afterwards


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("REINFORGE_SECRET_TOKEN", "hunter2")
    done = run_python("import os; print(sorted(os.environ))")
    assert done.stdout.strip() == "['HOME', 'LANG', 'PATH', 'TMPDIR']"


def test_time_limit_kills_an_infinite_loop():
    done = run_python("while True:\n    pass", timeout_s=1.0)
    assert done.timed_out and not done.ok and done.returncode < 0 and done.wall_s < 5


def test_time_limit_kills_forked_children_too():
    code = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\nelse:\n    time.sleep(60)"
    done = run_python(code, timeout_s=1.0)
    assert done.timed_out and done.wall_s < 5


def test_memory_hog_is_stopped():
    done = run_python("x = bytearray(2 * 1024**3)\nprint('allocated')", memory_mb=256)
    assert not done.ok and "MemoryError" in done.stderr and "allocated" not in done.stdout


def test_network_attempt_fails():
    code = ("import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n    print('connected')\n"
            "except OSError as exc:\n    print('refused', exc)")
    done = run_python(code, timeout_s=10)
    assert done.stdout.startswith("refused"), (network_isolation(), done.stdout, done.stderr)


def test_socket_guard_without_a_network_namespace(monkeypatch):
    import reinforge.sandbox as sandbox

    monkeypatch.setattr(sandbox, "_unshare_prefix", lambda: ())  # a machine where unshare is refused
    done = run_python("import socket\nsocket.socket()")
    assert "network access is disabled in the reinforge sandbox" in done.stderr


def test_output_is_truncated_and_files_are_capped():
    done = run_python("print('x' * 10000)", max_output_chars=100)
    assert done.ok and done.truncated and done.stdout == "x" * 100
    done = run_python(f"open('big', 'w').write('y' * {2 * MAX_FILE_BYTES})")
    assert not done.ok and "File too large" in done.stderr


def test_temp_dirs_are_removed_even_after_a_timeout():
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "reinforge-sandbox-*")))
    run_python("open('left.txt', 'w').write('x')\nwhile True:\n    pass", timeout_s=0.5)
    after = set(glob.glob(os.path.join(tempfile.gettempdir(), "reinforge-sandbox-*")))
    assert after <= before
