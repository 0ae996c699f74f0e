"""Real tokenizers without a model hub: vocab-only GGUF files from a package registry.

The source distribution of `llama-cpp-python` (on PyPI) ships llama.cpp's test vocabularies,
`vendor/llama.cpp/models/ggml-vocab-<name>.gguf`: the real tokenizers of Qwen2, Llama 3 and
others, without weights. transformers reads them (`gguf_file=`, needs the `gguf` package).
`vocab_folder(name)` fetches the sdist once with pip (by name and pinned version, so the index
pip is configured for is the one used), extracts the one file it needs, converts it into an
ordinary tokenizer folder (`tokenizer.json`, `tokenizer_config.json`, chat template) and caches
that outside the repository, under `$REINFORGE_CACHE` (default `~/.cache/reinforge`):

    <cache>/vocabs/<name>-<sdist version>/

Later calls return the folder at once. The conversion is atomic (a temporary folder renamed
into place), so an interrupted fetch leaves nothing half-written. `python -m
reinforge.models.vocabs qwen2 llama-bpe` fetches from the command line.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SDIST = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
# The names this module knows, and what they are the tokenizer of. Every one is a file
# `ggml-vocab-<name>.gguf` in the sdist above.
VOCABS = {
    "qwen2": "Qwen2 / Qwen2.5 / Qwen3 (151,936 ids, ChatML template)",
    "qwen35": "Qwen3.5",
    "llama-bpe": "Llama 3 / 3.1 / 3.2 (byte-level BPE, 128k ids)",
    "gpt-2": "GPT-2 (50,257 ids)",
    "phi-3": "Phi-3 (SentencePiece, 32k ids)",
    "deepseek-llm": "DeepSeek LLM",
    "gemma-4": "Gemma 4",
}


class VocabFetchError(RuntimeError):
    """The sdist could not be fetched or converted; the message says what to do."""


def cache_root() -> Path:
    """The folder real tokenizers are cached under (`$REINFORGE_CACHE`, default ~/.cache/reinforge)."""
    root = os.environ.get("REINFORGE_CACHE") or os.path.join(Path.home(), ".cache", "reinforge")
    return Path(root) / "vocabs"


def vocab_folder(name: str, *, quiet: bool = True) -> Path:
    """The cached tokenizer folder of vocabulary `name`, fetched and converted on first use.

    Returns a folder `AutoTokenizer.from_pretrained` loads. Raises ValueError for an unknown
    name and VocabFetchError when the registry cannot be reached or the file is missing.
    """
    if name not in VOCABS:
        raise ValueError(f"unknown vocabulary {name!r}; known: {', '.join(sorted(VOCABS))}")
    return cached_folder(cache_root() / f"{name}-{SDIST_VERSION}",
                         lambda tmp, out: _convert(_extract(name, tmp, quiet=quiet), out))


def cached_folder(dest: Path, build, ready=None) -> Path:
    """`dest`, a cached folder, built first if absent: `build(tmp, out)` writes the folder `out`
    using the scratch folder `tmp`, and `out` is renamed into place (atomic: an interrupted build
    leaves nothing half-written under `dest`). `ready(dest)` says whether a folder there is
    usable (default: it has a tokenizer_config.json); one that is not is rebuilt and replaced."""
    ready = ready or (lambda folder: (folder / "tokenizer_config.json").is_file())
    if ready(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}-") as tmp:
        out = Path(tmp) / "tokenizer"
        build(Path(tmp), out)
        if dest.exists() and not ready(dest):  # a stale folder: moved into the scratch folder, removed with it
            os.replace(dest, Path(tmp) / "stale")
        try:
            os.replace(out, dest)
        except OSError:
            # Another process built it first: theirs is as good as ours.
            if not ready(dest):
                raise
    return dest


def _sdist_path(quiet: bool) -> Path:
    """The sdist on disk: `$REINFORGE_VOCAB_SDIST` if set, else downloaded once by pip into the
    cache (`<cache>/sdist/`, kept so a second vocabulary needs no second download)."""
    given = os.environ.get("REINFORGE_VOCAB_SDIST")
    if given:
        if not Path(given).is_file():
            raise VocabFetchError(f"REINFORGE_VOCAB_SDIST={given} is not a file")
        return Path(given)
    spec = f"{SDIST}=={SDIST_VERSION}"
    work = cache_root().parent / "sdist"
    name = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    if (work / name).is_file():
        return work / name
    work.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(work), spec]
    if not quiet:
        print(f"fetching {spec} (sdist, ~77 MB) for its vocab files ...", file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not (work / name).is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise VocabFetchError(
            f"could not fetch {spec} from the package index (pip exited {proc.returncode}: "
            f"{' | '.join(tail) or 'no output'}). Real tokenizers come from that sdist: check "
            "the network or PIP_INDEX_URL, or download it elsewhere and point "
            "REINFORGE_VOCAB_SDIST at the .tar.gz")
    return work / name


def _extract(name: str, work: Path, quiet: bool) -> Path:
    """Extract `ggml-vocab-<name>.gguf` from the sdist into `work`; returns its path."""
    sdist = _sdist_path(quiet)
    member_tail = f"vendor/llama.cpp/models/ggml-vocab-{name}.gguf"
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(member_tail):
                src = tar.extractfile(member)
                target = work / f"ggml-vocab-{name}.gguf"
                with open(target, "wb") as f:
                    shutil.copyfileobj(src, f)
                return target
    raise VocabFetchError(f"{sdist.name} has no {member_tail}")


def _convert(gguf: Path, out: Path) -> None:
    """Convert a vocab-only GGUF file into a tokenizer folder with transformers."""
    try:
        import gguf as _  # noqa: F401  (transformers' reader needs it)
    except ImportError as e:
        raise VocabFetchError("converting a GGUF vocabulary needs the `gguf` package: "
                              "pip install gguf") from e
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.save_pretrained(str(out))


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or ["qwen2"]
    for name in names:
        try:
            print(vocab_folder(name, quiet=False))
        except (ValueError, VocabFetchError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
