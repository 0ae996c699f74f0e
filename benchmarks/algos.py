"""Benchmarks of reinforge.algos against the straightforward implementations.

    python benchmarks/algos.py            # full sizes (a few minutes on 2 cores)
    python benchmarks/algos.py --quick    # smaller sizes, a smoke run

Prints one markdown table. Timings are medians of several repeats in this process (the fused
row: one cold run, it takes seconds); peak memory is measured in a fresh subprocess per
variant (see the table footer).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from reinforge.algos import (  # noqa: E402
    AdvantageInput,
    compute_advantages,
    fused_logprobs_from_hidden,
    logprobs_and_entropy_from_logits,
    masked_whiten,
)


def median_time(fn, repeats: int, warmup: bool = True) -> float:
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ----------------------------------------------------------------------------- (1) GAE


def classic_gae(rewards, values, mask, gamma, lam):
    """The seed's per-time-step loop, with the same whitening."""
    nextvalues, lastgaelam, out = 0, 0, []
    for t in reversed(range(rewards.shape[-1])):
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * mask[:, t] + (1 - mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * mask[:, t] + (1 - mask[:, t]) * lastgaelam
        out.append(lastgaelam)
    adv = torch.stack(out[::-1], dim=1)
    return masked_whiten(adv, mask), adv + values


def bench_gae(B: int, T: int, repeats: int):
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(T // 4, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    mask[torch.rand(B, T, generator=g) < 0.05] = 0.0  # holes: tool-output tokens
    rewards = torch.zeros(B, T)
    rewards[torch.arange(B), lengths - 1] = torch.randn(B, generator=g)
    values = 0.1 * torch.randn(B, T, generator=g)
    inp = AdvantageInput(rewards, mask, values=values, gamma=1.0, lam=0.95)
    t_vec = median_time(lambda: compute_advantages("gae", inp), repeats)
    t_loop = median_time(lambda: classic_gae(rewards, values, mask, 1.0, 0.95), max(1, repeats // 3))
    adv, ret = compute_advantages("gae", inp)
    adv_ref, ret_ref = classic_gae(rewards, values, mask, 1.0, 0.95)
    diff = max((adv - adv_ref).abs().max().item(), (ret - ret_ref).abs().max().item())
    return t_loop, t_vec, diff


# ----------------------------------------------------------------------------- (2) groups


def loop_grpo(scores, index, eps=1e-6):
    """Per-sample Python loop (the seed's structure, with a proper unbiased std)."""
    groups: dict[int, list[float]] = {}
    ids = index.tolist()
    vals = scores.tolist()
    for i, s in zip(ids, vals):
        groups.setdefault(i, []).append(s)
    stats = {}
    for k, v in groups.items():
        n = len(v)
        mean = sum(v) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1)) if n > 1 else 0.0
        stats[k] = (mean, std)
    out = torch.empty_like(scores)
    for i in range(len(ids)):
        mean, std = stats[ids[i]]
        out[i] = (scores[i] - mean) / (std + eps) if len(groups[ids[i]]) > 1 else 0.0
    return out


def bench_groups(B: int, G: int, T: int, repeats: int):
    g = torch.Generator().manual_seed(1)
    ids = torch.arange(B // G).repeat_interleave(G)[torch.randperm(B, generator=g)]
    mask = torch.ones(B, T)
    rewards = torch.zeros(B, T)
    rewards[:, -1] = torch.randint(0, 2, (B,), generator=g).float()
    inp = AdvantageInput(rewards, mask, group_ids=ids)
    t_vec = median_time(lambda: compute_advantages("grpo", inp), repeats)
    t_loop = median_time(lambda: loop_grpo(rewards.sum(-1), ids), max(1, repeats // 3))
    adv, _ = compute_advantages("grpo", inp)
    diff = (adv[:, 0] - loop_grpo(rewards.sum(-1), ids)).abs().max().item()
    return t_loop, t_vec, diff


# ----------------------------------------------------------------------------- (3) log-probs


def naive_logp_entropy(logits, labels):
    logp_full = torch.log_softmax(logits, dim=-1)
    logp = logp_full.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    p = torch.softmax(logits, dim=-1)
    ent = torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)
    return logp, ent


def run_variant(variant: str, N: int, V: int, H: int, chunk: int, inputs=None):
    """One forward + backward of `variant`; loss = sum(logp) + 0.01 * sum(entropy)."""
    if inputs is None:
        inputs = make_inputs(variant, N, V, H)
    if variant == "fused":
        hidden, weight, labels = inputs
        hidden.grad = weight.grad = None
        logp, ent = fused_logprobs_from_hidden(hidden, weight, labels, chunk_size=chunk, return_entropy=True)
    else:
        logits, labels = inputs
        logits.grad = None
        fn = naive_logp_entropy if variant == "naive" else logprobs_and_entropy_from_logits
        logp, ent = fn(logits, labels)
    (logp.sum() + 0.01 * ent.sum()).backward()


def make_inputs(variant: str, N: int, V: int, H: int):
    g = torch.Generator().manual_seed(2)
    labels = torch.randint(0, V, (N,), generator=g)
    if variant == "fused":
        hidden = torch.randn(N, H, generator=g).requires_grad_(True)
        weight = torch.randn(V, H, generator=g).div_(math.sqrt(H)).requires_grad_(True)  # no temporary
        return hidden, weight, labels
    return torch.randn(N, V, generator=g).mul_(2.0).requires_grad_(True), labels


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """The process's RSS high-water mark (VmHWM), which `reset_peak_rss` can lower."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_peak_rss() -> None:
    """Set the RSS high-water mark to the current RSS (Linux >= 4.0: write 5 to clear_refs),
    so that the peak measured next belongs to the measured work alone, not to the warm-up or
    to temporaries made while building the inputs."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def mem_worker(variant: str, N: int, V: int, H: int, chunk: int) -> None:
    """Fresh process: peak RSS during fwd+bwd minus RSS after inputs (and warm-up)."""
    run_variant(variant, 64, V, H, chunk)  # warm-up on tiny inputs: thread pools, kernels
    inputs = make_inputs(variant, N, V, H)
    reset_peak_rss()
    base = current_rss_bytes()
    run_variant(variant, N, V, H, chunk, inputs)
    peak = peak_rss_bytes()
    if variant == "fused":
        grads = inputs[0].grad.nbytes + inputs[1].grad.nbytes  # parameter/activation grads
    else:
        grads = inputs[0].grad.nbytes  # the logits' gradient
    print(json.dumps({"extra": peak - base - grads}))


def measure_memory(variant: str, N: int, V: int, H: int, chunk: int) -> int:
    cmd = [sys.executable, os.path.abspath(__file__), "--mem-worker", variant, str(N), str(V), str(H), str(chunk)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["extra"]


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    ap.add_argument("--mem-worker", nargs=5, metavar=("VARIANT", "N", "V", "H", "CHUNK"))
    args = ap.parse_args()
    if args.mem_worker:
        v, *nums = args.mem_worker
        mem_worker(v, *map(int, nums))
        return
    q = args.quick
    B, T = (16, 1024) if q else (64, 8192)
    GB, G = (2048, 16) if q else (16384, 16)
    N, V, H, chunk = (512, 8000, 128, 0) if q else (4096, 32000, 256, 0)  # 0: the library's default chunking
    reps = 3 if q else 5
    rows = []

    t_loop, t_vec, diff = bench_gae(B, T, reps)
    rows.append((f"GAE B={B} T={T} (fp32, lam=0.95, holes)", "classic per-step loop vs vectorised scan",
                 f"{t_loop * 1e3:.1f} ms", f"{t_vec * 1e3:.2f} ms", f"{t_loop / t_vec:.0f}x (target >= 50x)",
                 f"max abs diff {diff:.1e} (target <= 1e-5)"))
    t_loop, t_vec, diff = bench_groups(GB, G, 4, reps)
    rows.append((f"GRPO advantages B={GB} G={G} (shuffled ids)", "per-sample python loop vs scatter",
                 f"{t_loop * 1e3:.1f} ms", f"{t_vec * 1e3:.2f} ms", f"{t_loop / t_vec:.0f}x (target >= 20x)",
                 f"max abs diff {diff:.1e}"))

    logits_bytes = N * V * 4
    mem = {v: measure_memory(v, N, V, H, chunk) for v in ("naive", "chunked", "fused")}
    timing_inputs = {v: make_inputs(v, N, V, H) for v in ("naive", "chunked")}
    t = {v: median_time(lambda v=v, x=timing_inputs[v]: run_variant(v, N, V, H, chunk, x), max(2, reps // 2))
         for v in ("naive", "chunked")}
    del timing_inputs
    fused_inputs = make_inputs("fused", N, V, H)
    t_fused = median_time(lambda: run_variant("fused", N, V, H, chunk, fused_inputs), 1, warmup=False)
    label = f"log-prob + entropy fwd+bwd N={N} V={V} fp32"
    pct = lambda b: f"{100 * b / logits_bytes:.1f}%"  # noqa: E731
    rows.append((label, "naive log_softmax + gather + softmax entropy", f"{t['naive'] * 1e3:.0f} ms", "-", "1.00x time",
                 f"peak extra {pct(mem['naive'])} of logits (expected >= 100%)"))
    rows.append((label, "logprobs_and_entropy_from_logits (chunked custom backward)", "-",
                 f"{t['chunked'] * 1e3:.0f} ms", f"{t['chunked'] / t['naive']:.2f}x time (target <= 1.2x)",
                 f"peak extra {pct(mem['chunked'])} of logits (target <= 10%)"))
    rows.append((f"same from hidden H={H}", f"fused_logprobs_from_hidden (default chunks: {max(1, (1 << 22) // V)} tokens)", "-",
                 f"{t_fused * 1e3:.0f} ms", "(includes the LM-head matmuls)",
                 f"peak extra {pct(mem['fused'])} of logits (target <= 25%)"))

    print("| benchmark | comparison | baseline | reinforge | ratio | check |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; times are medians of repeats "
          f"(loops: fewer repeats) after one warm-up, except the fused row: one cold run (no warm-up, no repeats).")
    print(f"Memory: each variant runs fwd+bwd once in a fresh subprocess after a tiny warm-up; peak extra = "
          f"peak RSS (VmHWM, reset after the inputs are built) - RSS after allocating the inputs - the gradient buffers autograd returns "
          f"(logits.grad; for fused hidden.grad + weight.grad), as % of the (N, V) fp32 logits "
          f"({logits_bytes / 2**20:.0f} MiB). The fused path never holds (N, V) logits at all.")


if __name__ == "__main__":
    main()
