"""Checks of a model folder's files that build no model: config.json, the weight files (each
safetensors header against its file's size) and the tokenizer files. Standard library only, so
a bad folder is refused in milliseconds, before torch or transformers load anything.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Optional

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
# Any one of these holds a vocabulary (fast tokenizer, sentencepiece, BPE, WordPiece).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model",
                   "sentencepiece.bpe.model")
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit


class ModelLoadError(ValueError):
    """A model or tokenizer folder that cannot be used."""


def safetensors_problem(path: str | os.PathLike) -> Optional[str]:
    """What is wrong with the layout of a .safetensors file, or None when it is sound.

    Layout: 8 bytes little-endian u64 N, then N bytes of JSON {tensor: {"dtype", "shape",
    "data_offsets": [begin, end]}, "__metadata__": {...}}, then the tensor data, which must end
    exactly at the file's end (a truncated copy fails here).
    """
    size = os.path.getsize(path)
    if size < 8:
        return f"{size} bytes, too short for the 8-byte header length (truncated?)"
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER_BYTES or 8 + n > size:
            return f"header length {n} does not fit in the file's {size} bytes (truncated or not safetensors)"
        raw = f.read(n)
    try:
        header = json.loads(raw)
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, IndexError, AttributeError) as exc:
        return f"header is not a safetensors header ({type(exc).__name__}: {exc})"
    expected = 8 + n + max(ends, default=0)
    if expected != size:
        return f"the header describes {expected} bytes but the file has {size} (truncated or corrupt)"
    return None


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def weight_files(folder: str | os.PathLike) -> list[Path]:
    """The weight files a from_pretrained load of `folder` reads (the shards of an index).
    ModelLoadError when there are none or an index names a missing shard."""
    folder = Path(folder)
    for name in WEIGHT_FILES:
        f = folder / name
        if not f.is_file():
            continue
        if not name.endswith(".index.json"):
            return [f]
        shards = sorted(set(_read_json(f).get("weight_map", {}).values()))
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing or not shards:
            raise ModelLoadError(f"{f}: names missing shard file(s) {missing[:3]}" if missing
                                 else f"{f}: empty weight_map")
        return [folder / s for s in shards]
    raise ModelLoadError(f"{folder}: no weight files (looked for {', '.join(WEIGHT_FILES)})")


def corrupt_weight_file(folder: str | os.PathLike) -> Optional[tuple[Path, str]]:
    """(file, problem) of the first unsound safetensors file of `folder`, or None."""
    for f in weight_files(folder):
        if f.suffix == ".safetensors":
            problem = safetensors_problem(f)
            if problem:
                return f, problem
    return None


def weight_shapes(folder: str | os.PathLike) -> Optional[dict[str, list[int]]]:
    """{tensor name: shape} of `folder`'s safetensors weights, read from the headers only;
    None when the weights are not safetensors (a pickled .bin cannot be read without loading)."""
    files = weight_files(folder)
    if any(f.suffix != ".safetensors" for f in files):
        return None
    shapes: dict[str, list[int]] = {}
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        shapes.update((k, v["shape"]) for k, v in header.items() if k != "__metadata__")
    return shapes


def weight_names(folder: str | os.PathLike) -> Optional[set[str]]:
    """Names of the tensors in `folder`'s safetensors weights (None for .bin weights)."""
    shapes = weight_shapes(folder)
    return None if shapes is None else set(shapes)


def missing_modules(names: set[str], targets: list[str]) -> list[str]:
    """The entries of `targets` that name no module holding a weight in `names`. A target
    matches a module whose dotted path is it or ends with "." + it (PEFT's rule)."""
    modules = {name.rsplit(".", 1)[0] for name in names}
    return [t for t in targets if not any(m == t or m.endswith("." + t) for m in modules)]


def check_model_files(folder: str | os.PathLike, key: str) -> None:
    """`folder` (config key `key`), known to hold a config.json (config.validate.check_model_path
    runs first), has a JSON object there and sound weight files."""
    folder = Path(folder)
    _read_json(folder / "config.json")
    bad = corrupt_weight_file(folder)
    if bad:
        raise ModelLoadError(f"{key}: weight file {bad[0]} is corrupt: {bad[1]}")


def check_tokenizer_files(folder: str | os.PathLike, key: str, trust_remote_code: bool = False,
                          fix: str = "copy the tokenizer files into it") -> None:
    """`folder` (config key `key`) holds a vocabulary. Without one, transformers falls back to an
    empty tokenizer that encodes every prompt to zero tokens, and a run "trains" on nothing.
    `fix` ends the message (what the user should do)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelLoadError(f"{key}='{folder}': no such tokenizer folder")
    if any((folder / name).is_file() for name in TOKENIZER_FILES):
        return
    tok_config = folder / "tokenizer_config.json"
    if trust_remote_code and tok_config.is_file() and "auto_map" in _read_json(tok_config):
        return  # a custom tokenizer class shipped with the model reads files of its own
    raise ModelLoadError(f"{key}='{folder}' has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}): {fix}")


# How a causal LM transforms its head's output z = hidden @ head.T before the softmax, read from
# its config, for the paths that compute logits from the head's weight (the fused log-probs, GKD):
# logits = cap * tanh(scale * z / cap), or scale * z without a cap (algos/logit_cap.py). A key
# means what its model type makes of it: HyperCLOVA X multiplies by `logits_scaling` where
# Granite divides, so a scaling key under a model type not listed here is refused, not guessed.
SOFTCAP_KEY = "final_logit_softcapping"  # Gemma-2/3/3n, VaultGemma, nanochat: the same meaning everywhere
LOGIT_SCALES = {  # key -> {model_type: how the value becomes `scale`}
    "logit_scale": {t: (lambda v: v) for t in ("cohere", "cohere2", "cohere2_moe")},
    "logits_scaling": {**{t: (lambda v: 1.0 / v) for t in (
        "granite", "granitemoe", "granitemoeshared", "granitemoehybrid", "granite_swa", "granitemoe_swa",
        "minicpm3")},  # MiniCPM3 divides the hidden states before the (bias-free) head: the same
        "hyperclovax": lambda v: v},
    "lm_head_multiplier": {"falcon_h1": lambda v: v},
    "output_multiplier": {},  # MuseSpark / MuseGlimmer: before the cap, on a multimodal text_config
}


def logit_transform(config) -> tuple[float, float]:
    """(scale, softcap) of the model's own transform of its head's output (1.0, 0.0: none), from
    its config: a transformers config object or a config.json dict (its text config for a
    multimodal one). ModelLoadError for a declared transform this table does not know how to apply."""
    get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    text = get("text_config")
    if text and not isinstance(config, dict) and hasattr(config, "get_text_config"):
        text = config.get_text_config()
    if text and text is not config:
        return logit_transform(text)
    model_type = get("model_type") or "?"
    cap = get(SOFTCAP_KEY)
    scale = 1.0
    for key, readers in LOGIT_SCALES.items():
        value = get(key)
        if value is None or value == 1:
            continue
        if model_type not in readers:
            raise ModelLoadError(
                f"model_type {model_type!r} declares {key}={value}, a transform of the LM head's output that "
                "reinforge's fused log-prob path (and teacher.mode=gkd) does not know how to apply for it: set "
                "model.fused_logprobs=false (the model's own forward applies it)")
        scale *= float(readers[model_type](value))
    return scale, float(cap) if cap else 0.0


def check_logit_transform(folder: str | os.PathLike, key: str) -> None:
    """Refuse, before any model loads, a model (config key `key`) whose config.json declares a
    transform of its head's output that `logit_transform` cannot apply (ModelLoadError)."""
    try:
        logit_transform(_read_json(Path(folder) / "config.json"))
    except ModelLoadError as exc:
        raise ModelLoadError(f"{key}: {exc}") from None
