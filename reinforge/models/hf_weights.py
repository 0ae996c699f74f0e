"""A model's weights under Hugging Face names, a PEFT LoRA adapter merged *out of place*: what
vLLM's `load_weights` and a `from_pretrained` folder take. Read one tensor at a time, so a
sharded (FSDP2) model streams them: each `full_tensor()` is one all-gather, and on a sharded
model every function here is a collective (every rank iterates in the same order).

The merge W + scale * B @ A is computed in fp32 on copies and cast to W's dtype; the model's
own tensors are never written, so the frozen base (and the adapter-disabled reference that
shares it) stays bit-identical however many times the weights are read (PEFT's
merge_adapter / unmerge_adapter would add and subtract in place, in the weights' dtype).

Tied weights (an LM head sharing the input embedding) appear once, under their first name in
the state dict (`model.embed_tokens.weight`), as `save_pretrained` writes them.
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

PEFT_PREFIX = "base_model.model."


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor shard (one all-gather), or `t` itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def unique_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict (DTensors on a sharded model) without the second name of a tied weight."""
    own = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    return {k: v for k, v in model.state_dict().items() if k in own}


def hf_plan(model: nn.Module) -> list[tuple[str, list[str], float]]:
    """[(Hugging Face name, state-dict keys, LoRA scale)] in state-dict order: a plain model's
    entries as they are; a PEFT model's base weights under their plain names, an adapted weight
    merged from [base, lora_A, lora_B] as W + scale * B @ A, the adapter entries themselves
    dropped (the export `merge_and_unload` would write)."""
    plan = []
    for key in unique_state(model):
        if ".lora_" in key:
            continue
        name = key.removeprefix(PEFT_PREFIX).replace(".base_layer.", ".")
        if key.endswith(".base_layer.weight"):
            prefix = key[: -len(".base_layer.weight")]
            layer = model.get_submodule(prefix)
            (adapter,) = layer.active_adapters
            plan.append((name, [key, f"{prefix}.lora_A.{adapter}.weight", f"{prefix}.lora_B.{adapter}.weight"],
                         float(layer.scaling[adapter])))
        else:
            plan.append((name, [key], 0.0))
    return plan


def hf_tensors(model: nn.Module, rename=None) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, full tensor) per hf_plan entry, LoRA merged out of place (fp32, then
    the weight's dtype); what vLLM's `load_weights` and a `from_pretrained` folder take.
    rename(name) -> the name to give it, or None to leave the entry out (not gathered)."""
    state = unique_state(model)
    for name, keys, scale in hf_plan(model):
        if rename is not None and (name := rename(name)) is None:
            continue
        w = full_tensor(state[keys[0]]).detach()
        if len(keys) == 3:
            a, b = (full_tensor(state[k]).detach().float() for k in keys[1:])
            w = (w.float() + scale * (b @ a)).to(w.dtype)
        yield name, w
