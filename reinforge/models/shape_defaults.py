"""Defaults that depend on the model's size and the machine: the `auto` values of model.autocast,
rollout.dtype and the actor's AdamW kernel, resolved once by the run plan (trainers/plan.py).

They switch on only for a model of at least LARGE_PARAMS parameters (counted from its
config.json, before it loads), so the small models of the demo, the presets and the tests keep
their fp32 numerics bit for bit; at the shapes users run (a 0.5B model and up) the step is
bound by the matmuls and the weight reads that bf16 halves:

- model.autocast=auto -> bf16 when the device runs bf16 matmuls natively (a CUDA GPU that
  supports bf16; a CPU with avx512_bf16 or amx_bf16), else none;
- rollout.dtype=auto -> bfloat16 (decode from a bf16 copy of the fp32 weights, made at each
  generation: rollout/decode_weights.py) under the same condition, when the weights are fp32
  and the backend decodes in-process (lean). The sampled tokens then come from a slightly
  different policy than the one trained, which the plan corrects with truncated importance
  sampling (rollout.tis_cap) and the actor logs as rollout_corr/*;
- fused AdamW (one pass per tensor, no temporaries: the fp32 AdamW of a 136M-entry embedding
  otherwise allocates two 0.5 GB temporaries per step) for a large actor.
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

LARGE_PARAMS = 100_000_000
"""Parameters from which the `auto` defaults switch on (the demo's model has 3M)."""


def config_params(model_path: str) -> int:
    """Parameters of a decoder-only HF model estimated from its config.json (0 when unreadable):
    embeddings (twice untied), per layer attention (q, k, v, o) and a gated MLP. Exact for
    Qwen2 / Llama up to norms and biases, which is all a threshold needs."""
    try:
        c = json.loads((Path(model_path) / "config.json").read_text())
        c = c.get("text_config", c)
        H, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
        inter = c.get("intermediate_size", 4 * H)
        heads = c.get("num_attention_heads", 1)
        head_dim = c.get("head_dim") or H // heads
        kv = c.get("num_key_value_heads", heads) * head_dim
        attn = H * heads * head_dim * 2 + 2 * H * kv
        return V * H * (1 if c.get("tie_word_embeddings", True) else 2) + L * (attn + 3 * H * inter)
    except (OSError, KeyError, TypeError, ValueError):
        return 0


@functools.lru_cache(maxsize=None)
def bf16_native(device: str) -> bool:
    """Whether `device` runs bf16 matmuls natively: a CUDA GPU with bf16, or a CPU whose flags
    include avx512_bf16 or amx_bf16 (without them bf16 is emulated and slower than fp32)."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def large(n_params: int) -> bool:
    return n_params >= LARGE_PARAMS


def resolve_autocast(value: str, n_params: int, device: str) -> str:
    """model.autocast: `auto` -> bf16 for a large model on a bf16-native device, else none."""
    if value != "auto":
        return value
    return "bf16" if large(n_params) and bf16_native(device) else "none"


def resolve_rollout_dtype(value: str, n_params: int, device: str, backend: str, weights_dtype: str) -> str:
    """rollout.dtype: `auto` -> bfloat16 for a large fp32 model decoded in-process (lean) on a
    bf16-native device, else model (decode with the training weights as they are)."""
    if value != "auto":
        return value
    fp32 = weights_dtype in ("float32",) or (weights_dtype == "auto" and not device.startswith("cuda"))
    return "bfloat16" if backend == "lean" and fp32 and large(n_params) and bf16_native(device) else "model"
