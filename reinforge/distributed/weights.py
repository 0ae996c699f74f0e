"""Full weights out of FSDP2 shards, one tensor at a time: into a rank's generation engine, and
into safetensors files written by rank 0 (checkpoints and the HF export), so no process ever
holds the whole model for it.

Every function here is a collective: every rank calls it with the same model and iterates the
tensors in the same order, each `full_tensor()` being one all-gather. Peak extra memory is one
full tensor per rank (three for a LoRA-merged weight: base, A, B).

Tied weights (an LM head sharing the input embedding) appear once, under their first name in
the state dict (`model.embed_tokens.weight`), as `save_pretrained` writes them.
"""
from __future__ import annotations

import json
from typing import Iterator

import torch
from torch import nn

# where the state dict's names become Hugging Face ones, LoRA merged out of place: the models
# layer's, shared with the vLLM rollout (which must not import this layer)
from reinforge.models.hf_weights import PEFT_PREFIX, full_tensor, hf_plan, hf_tensors, unique_state  # noqa: F401

ST_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64",
             torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
             torch.bool: "BOOL"}


def full_tensors(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(state-dict name, full tensor) for every entry of unique_state, gathered one at a time."""
    for name, t in unique_state(model).items():
        yield name, full_tensor(t).detach()


def copy_full(sharded: nn.Module, dense: nn.Module) -> None:
    """Fill the unsharded copy `dense` (same architecture and names) from `sharded`'s shards."""
    target = dense.state_dict()
    with torch.no_grad():
        for name, t in full_tensors(sharded):
            target[name].copy_(t)


def _specs(model: nn.Module, hf: bool, rename=None) -> list[tuple[str, torch.dtype, tuple]]:
    state = unique_state(model)
    if hf:
        specs = [(rename(name) if rename else name, state[keys[0]].dtype, tuple(state[keys[0]].shape))
                 for name, keys, _ in hf_plan(model)]
        return [s for s in specs if s[0] is not None]
    return [(k, v.dtype, tuple(v.shape)) for k, v in state.items()]


def safetensors_header(specs: list[tuple[str, torch.dtype, tuple]], metadata: dict | None = None) -> bytes:
    """The 8-byte length and JSON header of a safetensors file holding `specs` in that order,
    padded with spaces to a multiple of 8 bytes (the format's alignment)."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = metadata
    for name, dtype, shape in specs:
        size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        header[name] = {"dtype": ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def write_safetensors(model: nn.Module, path, *, write: bool, hf: bool = False,
                      metadata: dict | None = None, rename=None) -> None:
    """Collective: stream `model`'s full weights into one safetensors file at `path`, written by
    the rank with `write` (the others only take part in the gathers). The header is computed
    from the shards' global shapes first, then each tensor's bytes follow as it is gathered.
    `hf`: Hugging Face names, LoRA merged (hf_tensors); else the state-dict names (what
    `safetensors.torch.load_model` reads back into the same model). rename (hf only): the
    file's name of each Hugging Face name, or None for an entry the file leaves out."""
    specs = _specs(model, hf, rename)
    tensors = hf_tensors(model, rename) if hf else full_tensors(model)
    f = open(path, "wb") if write else None
    try:
        if f is not None:
            f.write(safetensors_header(specs, metadata))
        for (name, dtype, shape), (got, t) in zip(specs, tensors, strict=True):
            if f is not None:
                assert got == name and t.dtype == dtype and tuple(t.shape) == shape, (name, got)
                f.write(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    finally:
        if f is not None:
            f.close()


def save_hf(model: nn.Module, folder, *, write: bool) -> None:
    """Collective: a `from_pretrained` folder's weights (model.safetensors, LoRA merged) and
    config, written by the rank with `write`; the tokenizer is the caller's. A VLM's value
    model (models/vlm_critic.VisionValueModel) is written as its own save_pretrained lays it
    out, the backbone's weights under the backbone's names and the head apart, so
    `load_critic` reads it back with its head."""
    from reinforge.models.forward import unwrap_peft
    from reinforge.models.vlm_critic import HEAD_FILE, VisionValueModel

    inner = unwrap_peft(model)
    if isinstance(inner, VisionValueModel):
        for file, prefix in (("model.safetensors", "model."), (HEAD_FILE, "score.")):
            write_safetensors(model, f"{folder}/{file}", write=write, hf=True, metadata={"format": "pt"},
                              rename=lambda n, p=prefix: n[len(p):] if n.startswith(p) else None)
    else:
        write_safetensors(model, f"{folder}/model.safetensors", write=write, hf=True, metadata={"format": "pt"})
    if write:
        inner.config.save_pretrained(folder)
        if getattr(inner, "generation_config", None) is not None:
            inner.generation_config.save_pretrained(folder)
