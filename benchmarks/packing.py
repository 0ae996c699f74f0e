"""Training throughput with and without sequence packing, side by side in one process.

    python benchmarks/packing.py            # default sizes (about a minute on 2 cores)
    python benchmarks/packing.py --quick    # a smoke run

A batch of B sequences of L = P + T slots whose real lengths are spread so that about half of
the slots are padding (the shape of a GRPO batch with varied response lengths). Each variant
runs the actor's full update (forward, backward, optimizer step) on the same batch:

- padded: micro-batches of `--micro` sequences, (micro, L) each;
- packed: padding removed, micro-batches by a budget of micro * L / 2 real tokens
  (`actor.max_tokens_per_micro_batch`, `model.use_packing=true`).

Throughput counts real (non-padding) tokens. Timings are medians of `--repeats` updates after
a warm-up, the two variants alternating. The table also prints each variant's gradient norm (from its
last update) so the two can be compared by eye; nothing is asserted.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from reinforge.config.schema import ActorConfig, ModelConfig  # noqa: E402
from reinforge.models.loading import load_causal_lm  # noqa: E402
from reinforge.models.tiny import make_tiny_model  # noqa: E402
from reinforge.protocol import Batch  # noqa: E402
from reinforge.tasks import build_char_tokenizer  # noqa: E402
from reinforge.workers.actor import ActorWorker  # noqa: E402


def ragged_batch(B: int, P: int, T: int, vocab: int, seed: int = 0) -> Batch:
    """Prompt lengths in [P/4, P], response lengths in [1, T]: about 50% padding for P ~ T/2."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (B, P + T), generator=g)
    mask = torch.zeros(B, P + T, dtype=torch.long)
    p_len = torch.randint(max(1, P // 4), P + 1, (B,), generator=g)
    r_len = torch.randint(1, T + 1, (B,), generator=g)
    for b in range(B):
        mask[b, P - p_len[b]:P + r_len[b]] = 1
    ids = ids * mask
    return Batch({"input_ids": ids, "attention_mask": mask, "responses": ids[:, -T:], "response_mask": mask[:, -T:],
                  "advantages": torch.randn(B, T, generator=g), "old_log_probs": torch.zeros(B, T)})


def make_actor(model_dir: str, packed: bool, micro: int, budget: int, B: int) -> ActorWorker:
    model = load_causal_lm(model_dir, dtype="float32")
    cfg = ActorConfig(lr=1e-6, micro_batch_size=micro, max_tokens_per_micro_batch=budget if packed else 0)
    return ActorWorker(model, cfg, ModelConfig(path=model_dir, use_packing=packed), total_steps=10**6,
                       mini_batch_size=B, micro_batch_size=micro, loss_norm_const=1.0, seed=0)


def time_interleaved(actors: dict[str, ActorWorker], batch: Batch, repeats: int) -> dict[str, tuple[float, float]]:
    """Median update time per variant. Variants alternate within each repeat, so a busy
    (shared) machine slows both alike instead of whichever ran during the busy spell."""
    times: dict[str, list[float]] = {k: [] for k in actors}
    gn = {}
    for a in actors.values():
        a.update(batch)  # warm-up
    for _ in range(repeats):
        for name, a in actors.items():
            t0 = time.perf_counter()
            gn[name] = a.update(batch)["actor/grad_norm"]
            times[name].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), gn[k]) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--response-len", type=int, default=192)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.quick:
        args.batch, args.prompt_len, args.response_len, args.repeats = 16, 16, 48, 2
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    B, P, T = args.batch, args.prompt_len, args.response_len
    with tempfile.TemporaryDirectory() as d:
        tok = build_char_tokenizer()
        make_tiny_model(tok, d, seed=0, max_positions=P + T)  # hidden 256, 4 layers (~3M params)
        batch = ragged_batch(B, P, T, len(tok))
        real = int(batch["attention_mask"].sum())
        budget = args.micro * (P + T) // 2
        actors = {name: make_actor(d, packed, args.micro, budget, B) for name, packed in (("padded", False),
                                                                                         ("packed", True))}
        res = time_interleaved(actors, batch, args.repeats)
        rows = [(name, sec, real / sec, gn) for name, (sec, gn) in res.items()]
    pad = 1 - real / batch["attention_mask"].numel()
    print(f"\nactor update, tiny Qwen2 (hidden 256, 4 layers), B={B}, L={P + T}, padding {pad:.0%}, "
          f"micro={args.micro} seqs vs budget={budget} tokens, threads={torch.get_num_threads()}\n")
    print("| variant | median update (s) | real tokens/s | speed-up | grad_norm |")
    print("|---|---:|---:|---:|---:|")
    for name, sec, tps, gn in rows:
        print(f"| {name} | {sec:.3f} | {tps:,.0f} | {rows[0][1] / sec:.2f}x | {gn:.6f} |")


if __name__ == "__main__":
    main()
