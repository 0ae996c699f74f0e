"""The longest sequence one training micro-step (forward + backward of the actor's loss) fits in a
fixed memory budget per rank, without and with Ulysses sequence parallelism
(`trainer.sequence_parallel`, models/seq_parallel.py), at the Qwen2.5-0.5B shape (random init).

    python benchmarks/sequence_parallel.py                       # 2 layers, budget 3.5 GiB per rank
    python benchmarks/sequence_parallel.py --layers 4 --budget-gib 5

Both settings run 2 CPU ranks (gloo) with the model sharded by FSDP2 over both, so weights,
gradients and the gathered layers cost each rank the same; only the rows differ:
  k=1  data parallel: each rank trains its own row of L tokens;
  k=2  one sequence-parallel group: both ranks train the same row, each holding L / 2 positions.
A row is one unpadded sequence of L tokens whose last `--response` tokens are the response the
loss reads (old log-probs, advantages: random), through the actor's own loss terms (PPO clip,
token-mean, entropy bonus) and the fused log-prob head.

Memory is each rank's peak RSS (ru_maxrss) in a fresh process per trial (the peak only grows
within one); "step" is that peak minus the rank's RSS just before the step (weights sharded,
imports done): activations, the gathered layers, the gradients and the allocator's slack. The
search doubles L from --start while the larger of the two ranks' peaks stays within the budget,
then bisects to --resolution tokens.

Fewer layers than the real 24 (the default 2) keep a trial within a minute or two on the 2-core
CPU box; the memory per token grows with the layers (docs/distributed.md, "Long sequences", has
the measured table).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
ARCH = "qwen2.5-0.5b"


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _row(vocab: int, length: int, response: int, seed: int):
    """One unpadded row of `length` tokens, its last `response` tokens the response."""
    import torch

    from reinforge.protocol import Batch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (1, length), generator=g)
    T = response
    return Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids), "responses": ids[:, -T:],
                  "response_mask": torch.ones(1, T, dtype=torch.long),
                  "advantages": torch.randn(1, T, generator=g), "old_log_probs": -5 - torch.rand(1, T, generator=g)})


def rank_main(rank: int, port: int, k: int, length: int, layers: int, response: int, out: str) -> None:
    """One rank of one trial: shard the model, one forward + backward of the actor loss, report."""
    import torch
    import torch.distributed as dist

    from reinforge.algos.aggregation import agg_denominators
    from reinforge.config.schema import ActorConfig, ModelConfig
    from reinforge.distributed import fsdp
    from reinforge.models import seq_parallel
    from reinforge.models.archs import build_model
    from reinforge.workers.actor import ActorWorker

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    seq_parallel.init_groups(k)
    model = fsdp.shard_model(build_model(ARCH, layers=layers, seed=0))
    actor = ActorWorker(model, ActorConfig(entropy_coeff=0.01, grad_clip=0), ModelConfig(path="", fused_logprobs=True),
                        total_steps=1, mini_batch_size=2, micro_batch_size=1, loss_norm_const=1, seed=0)
    # k=1: each rank its own row (data parallel); k=2: the group's one row, split along its length
    mb = _row(model.config.vocab_size, length, response, seed=rank // k)
    denom = agg_denominators(mb["response_mask"].float())
    model.train()
    dist.barrier()
    before, t0 = _rss_mb(), time.perf_counter()
    loss, _ = actor._micro_loss(mb, denom, 1.0)
    (loss * 2).backward()
    dist.barrier()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(out, "w") as f:
        json.dump({"peak_mb": peak, "before_mb": before, "seconds": seconds, "loss": float(loss)}, f)
    dist.destroy_process_group()


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trial(k: int, length: int, args) -> dict:
    """Both ranks of one trial in fresh processes -> the larger rank's peak, step memory, time."""
    with tempfile.TemporaryDirectory() as tmp:
        port, outs = _port(), [os.path.join(tmp, f"rank{r}.json") for r in range(2)]
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               "OMP_NUM_THREADS": "1"}
        procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port), "--k", str(k),
                                   "--length", str(length), "--layers", str(args.layers), "--response",
                                   str(args.response), "--out", outs[r]], env=env, stderr=subprocess.PIPE, text=True)
                 for r in range(2)]
        errs = [p.communicate()[1] for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError(f"trial k={k} L={length} failed:\n{errs[0][-2000:]}\n{errs[1][-2000:]}")
        res = [json.load(open(o)) for o in outs]
    return {"k": k, "length": length, "peak_mb": max(r["peak_mb"] for r in res),
            "step_mb": max(r["peak_mb"] - r["before_mb"] for r in res),
            "seconds": max(r["seconds"] for r in res)}


def longest(k: int, args, rows: list) -> int:
    """The longest L (to args.resolution) whose trial stays within the budget; 0 if none does."""
    budget = args.budget_gib * 1024

    def fits(length: int) -> bool:
        t = trial(k, length, args)
        rows.append(t)
        print(f"  k={k} L={length:6d}: peak {t['peak_mb']:7.0f} MB, step {t['step_mb']:6.0f} MB, "
              f"{t['seconds']:5.1f} s{'' if t['peak_mb'] <= budget else '  (over budget)'}", flush=True)
        return t["peak_mb"] <= budget

    lo, hi = 0, args.start
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > args.resolution:
        mid = (lo + hi) // 2 // args.resolution * args.resolution
        if mid <= lo:
            break
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2, help="decoder layers of the 0.5B shape (the real model: 24)")
    p.add_argument("--budget-gib", type=float, default=3.5, help="peak RSS allowed per rank")
    p.add_argument("--response", type=int, default=128, help="response tokens at the end of the row")
    p.add_argument("--start", type=int, default=4096)
    p.add_argument("--resolution", type=int, default=1024)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--k", type=int, help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        return rank_main(args.rank, args.port, args.k, args.length, args.layers, args.response, args.out)
    print(f"{ARCH} shape, {args.layers} layers, 2 CPU ranks (FSDP2, gloo), budget {args.budget_gib} GiB peak RSS "
          f"per rank, response {args.response} tokens", flush=True)
    rows, best = [], {}
    for k in (1, 2):
        best[k] = longest(k, args, rows)
    print("\n| k | longest L within budget | step MB per 1k tokens (fit) | s per trial at that L |")
    print("|---|---:|---:|---:|")
    for k in (1, 2):
        mine = sorted((r for r in rows if r["k"] == k), key=lambda r: r["length"])
        slope = ((mine[-1]["step_mb"] - mine[0]["step_mb"]) / (mine[-1]["length"] - mine[0]["length"]) * 1000
                 if len(mine) > 1 and mine[-1]["length"] > mine[0]["length"] else float("nan"))
        at = next((r["seconds"] for r in mine if r["length"] == best[k]), float("nan"))
        print(f"| {k} | {best[k]} | {slope:.0f} | {at:.1f} |")
    if best[1]:
        print(f"\nk=2 / k=1: {best[2] / best[1]:.2f}x the tokens per row at the same budget")


if __name__ == "__main__":
    main()
