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
from dataclasses import dataclass
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


# ---- memory: activation checkpointing and the actor's / critic's micro-batch from a budget -------
SMALL_MICRO_BATCH = 16
"""actor.micro_batch_size=0 (auto) below LARGE_PARAMS: the former fixed default, so the small models
of the demo, the presets and the tests keep their numerics bit for bit."""
BUDGET_FRACTION = 0.8
"""model.memory_budget_gb=0: this share of the device's total memory (the rest: the runtime, the
rollout's KV cache and decode copy, the allocator's slack)."""
FUSED_HEAD_BYTES = 3 * (256 << 20)
"""What the fused log-prob head keeps alive at once besides the head's gradient: its (chunk, V)
fp32 buffers (algos/fused_logprobs.FUSED_CHUNK_BUDGET, ~3 of them) and the bf16 head copy and
bf16 gradient sum of a large vocabulary, bounded together by ~3 x 256 MiB at V = 152k."""


def model_shape(model_path: str) -> dict | None:
    """{hidden, layers, vocab, inter, heads, head_dim, kv} of a decoder-only HF model from its
    config.json (None when unreadable)."""
    try:
        c = json.loads((Path(model_path) / "config.json").read_text())
        c = c.get("text_config", c)
        H, heads = c["hidden_size"], c.get("num_attention_heads", 1)
        head_dim = c.get("head_dim") or H // heads
        return {"hidden": H, "layers": c["num_hidden_layers"], "vocab": c["vocab_size"],
                "inter": c.get("intermediate_size", 4 * H), "heads": heads, "head_dim": head_dim,
                "kv": c.get("num_key_value_heads", heads) * head_dim}
    except (OSError, KeyError, TypeError, ValueError):
        return None


def full_attention(model_path: str) -> bool:
    """Whether every decoder layer of the model in config.json attends to all earlier tokens (no
    sliding window, no linear attention): the models whose key/value cache models/shared_prompt.py
    can share. False when unreadable, for vision-language models (their image prompts run whole
    rows) and for MoE models (the actor's router hooks replay and capture whole rows)."""
    try:
        c = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if "vision_config" in c:
        return False
    if c.get("num_experts") or c.get("num_local_experts"):  # MoE: the actor's router hooks need whole rows
        return False
    types = c.get("layer_types") or []
    sliding = c.get("sliding_window") and c.get("use_sliding_window", True)
    return all(t == "full_attention" for t in types) and not (sliding and not types)


def shared_tokens(rows: int, n: int, prompt: int, response: int) -> int:
    """Tokens through the decoder for `rows` rows of n samples per prompt when each prompt runs
    once (models/shared_prompt.py): ceil(rows / n) prompts plus every response."""
    return -(-rows // max(n, 1)) * prompt + rows * response


def activation_bytes(shape: dict, rows: int, seq: int, *, checkpointing: bool, matmul_bytes: int,
                     resid_bytes: int, eager_attention: bool = False) -> int:
    """Bytes autograd keeps for the backward of `rows` sequences of `seq` tokens through a
    Qwen2 / Llama decoder (an upper bound: every row at the full length).

    Per token and layer without checkpointing: the residual stream and the two RMSNorms in the
    weights' precision (~6 H: input, rsqrt, normalised output, twice), the matmuls' saved operands
    in the matmul precision (q/k/v input H, RoPE's q H and k kv, sdpa's q, k, v and output H + 2 kv
    + H, o_proj's input H, the MLP's input H; gate, silu(gate), up and their product 4 I); eager
    attention adds its (heads, seq) score and probability rows. With checkpointing each layer
    keeps only its input (H in the residual's precision) and one layer's full set lives during its
    recompute."""
    H, I, kv = shape["hidden"], shape["inter"], shape["kv"]
    per_layer = 6 * H * resid_bytes + (6 * H + 4 * kv + 4 * I) * matmul_bytes
    if eager_attention:
        per_layer += 2 * shape["heads"] * seq * matmul_bytes
    tokens = rows * seq
    if checkpointing:
        return tokens * (shape["layers"] * H * resid_bytes + per_layer)
    return tokens * shape["layers"] * per_layer


def head_bytes(shape: dict, tokens: int, fused: bool, value_head: bool = False) -> int:
    """What the head adds at its backward: the fused path's chunk buffers and bf16 copies
    (FUSED_HEAD_BYTES at most, less for a small vocabulary), or the logits path's (tokens, V)
    fp32 logits, log-softmax and gradient; a critic's value head (one output per token): 0."""
    V, H = shape["vocab"], shape["hidden"]
    if value_head:
        return 0
    if fused:
        return min(FUSED_HEAD_BYTES, 3 * 4 * V * tokens + 4 * V * H)
    return 3 * 4 * V * tokens


def device_memory_bytes(device: str) -> int:
    """The device's total memory: a CUDA GPU's, or the CPU's (MemTotal, or a smaller cgroup limit)."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    total = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit.isdigit():
            total = min(total, int(limit)) if total else int(limit)
    except OSError:
        pass
    return total or 16 << 30


def memory_budget(budget_gb: float, device: str) -> int:
    """model.memory_budget_gb in bytes; 0: BUDGET_FRACTION of the device's total memory."""
    return int(budget_gb * 1e9) if budget_gb > 0 else int(BUDGET_FRACTION * device_memory_bytes(device))


@dataclass(frozen=True)
class MemoryPlan:
    """What resolve_memory decided, and the estimate it decided by (bytes)."""
    gradient_checkpointing: bool
    micro_batch_size: int
    state_bytes: int
    """Weights, gradients and AdamW's two moments (plus a reference copy's weights, plus the
    resident_bytes of another trained model: the actor's, for the critic's plan)."""
    activation_bytes: int
    """The micro-batch's activations (resolve's checkpointing) plus the log-prob head's buffers."""
    budget_bytes: int

    def line(self) -> str:
        gb = 1e9
        return (f"memory: {self.state_bytes / gb:.2f} GB weights + grads + AdamW, "
                f"{self.activation_bytes / gb:.2f} GB activations of a micro-batch of {self.micro_batch_size}, "
                f"budget {self.budget_bytes / gb:.2f} GB -> gradient checkpointing "
                f"{'on' if self.gradient_checkpointing else 'off'}")


def _flag(value) -> str:
    """model.gradient_checkpointing as one of auto / true / false (YAML's booleans arrive as 'True')."""
    return str(value).strip().lower()


def checkpointing_choice(value) -> str | None:
    """auto / true / false, or None for a value that is none of them."""
    v = _flag(value)
    return v if v in ("auto", "true", "false") else None


def resolve_memory(*, ckpt: str, micro: int, mini: int, seq: int, model_path: str, device: str, budget_gb: float,
                   weights_bytes: int, bf16_autocast: bool, trained_fraction: float = 1.0, reference: bool = False,
                   fused: bool = True, eager_attention: bool = False, value_head: bool = False,
                   resident_bytes: int = 0, shared: tuple[int, int, int] | None = None) -> MemoryPlan:
    """model.gradient_checkpointing and actor.micro_batch_size (0: auto) resolved against the
    memory budget from the model's config.json; rows per micro-batch divide `mini`.
    The critic's micro-batch is resolved the same way (`value_head`: no LM head buffers), with
    `ckpt` already the actor's choice and `resident_bytes` the actor's state, which stays in
    memory during the critic's update (both share the budget).

    Below LARGE_PARAMS (or without a readable config.json), auto means off and SMALL_MICRO_BATCH
    (the former defaults, so small models' numerics do not change). From LARGE_PARAMS on, an auto
    micro-batch is the largest divisor of the mini-batch whose activations fit the budget left by
    the training state (larger micro-batches run the matmuls closer to their peak; accumulation
    is exact, so the gradient does not depend on it). Auto checkpointing is on for a CPU: at the
    Qwen2.5-0.5B shape it took 1.1-1.2 GB off the step's peak (the heap glibc keeps at the size
    of the activations) for 0-5% of a step, with and without AMX (docs/performance.md, "Packing
    from the training weights"); on a GPU, where the second forward is estimated at ~30% of an
    update, only when even one row would not fit without it. `shared` = (n, prompt, response
    lengths) when the actor's forwards share each prompt's cache (model.share_prompt on a
    full-attention model, no packing): that path needs checkpointing off, and its activations
    are those of shared_tokens, not rows x seq; auto checkpointing on a CPU is then off where
    that fits the budget (at the chain_sum demo's shape it took a step from 26.5 to 10.7 CPU-s,
    docs/performance.md)."""
    n, shape = config_params(model_path), model_shape(model_path)
    budget = memory_budget(budget_gb, device)
    state = int(n * weights_bytes * (1 + 3 * trained_fraction) + (n * weights_bytes if reference else 0)) \
        + resident_bytes
    choice = _flag(ckpt)
    matmul = 2 if bf16_autocast else weights_bytes

    def act(rows: int, on: bool) -> int:
        if shape is None:
            return 0
        r, q = (1, shared_tokens(rows, *shared)) if shared and not on else (rows, seq)
        return (activation_bytes(shape, r, q, checkpointing=on, matmul_bytes=matmul, resid_bytes=weights_bytes,
                                 eager_attention=eager_attention) + head_bytes(shape, rows * seq, fused, value_head))

    if shape is None or not large(n):
        rows = micro or _divisor_at_most(mini, SMALL_MICRO_BATCH)
        return MemoryPlan(choice == "true", rows, state, act(rows, choice == "true"), budget)

    def fits(rows: int, on: bool) -> bool:
        return state + act(rows, on) <= budget

    if choice != "auto":
        options = [choice == "true"]
    else:
        options = [True] if _cpu(device) and not shared else [False, True]
    if micro:
        on = next((o for o in options if fits(micro, o)), options[-1])
        return MemoryPlan(on, micro, state, act(micro, on), budget)
    for on in options:
        rows = next((d for d in _divisors_desc(mini) if fits(d, on)), 0)
        if rows:
            return MemoryPlan(on, rows, state, act(rows, on), budget)
    return MemoryPlan(options[-1], 1, state, act(1, options[-1]), budget)  # over budget even so: the smallest


def _cpu(device: str) -> bool:
    return str(device).split(":")[0] == "cpu"


def _divisors_desc(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def _divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of n that is <= cap (a micro-batch must divide its mini-batch)."""
    return next(d for d in _divisors_desc(n) if d <= max(cap, 1))
