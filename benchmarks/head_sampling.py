"""The large-vocabulary hot spots at the Qwen2.5-0.5B widths, one at a time: the fused log-prob
head's forward + backward at the update's shape, and one decode step's sampling over the
vocabulary, the lean loop's `sample_large_vocab` against the log-softmax path it replaced
(sampling_log_probs, its exp, sample_inverse_cdf: both are in the tree).

    python benchmarks/head_sampling.py [--tokens 512] [--rows 16] [--rounds 4]

CPU time (time.process_time) per call, medians over alternating rounds, so a loaded machine
moves the figures less than wall time would; run with OMP_NUM_THREADS=1 for per-core numbers.
To compare the head with an earlier tree, run this file there too (docs/performance.md).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from reinforge.algos.fused_logprobs import auto_chunk_rows, fused_logprobs_from_hidden
from reinforge.algos.logprobs import sampling_log_probs
from reinforge.workers.rollout.lean import sample_inverse_cdf, sample_large_vocab

H, V = 896, 151936


def cpu_s(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


def head(tokens: int, rounds: int) -> None:
    g = torch.Generator().manual_seed(0)
    h = torch.randn(tokens, H, generator=g).requires_grad_()
    w = (torch.randn(V, H, generator=g) * 0.02).requires_grad_()
    y = torch.randint(0, V, (tokens,), generator=g)

    def run(ent_coef: float):
        h.grad = w.grad = None
        lp, ent = fused_logprobs_from_hidden(h, w, y, return_entropy=True)
        (lp.sum() - ent_coef * ent.sum() if ent_coef else lp.sum()).backward()

    res = {0.0: [], 0.01: []}
    for r in range(rounds):
        for c in (res if r % 2 == 0 else list(res)[::-1]):
            res[c].append(cpu_s(lambda: run(c)))
    flop = 8 * tokens * H * V  # forward, recomputed logits, grad of hidden, grad of the head
    print(f"\nfused head, {tokens} tokens x {H} x {V}, fp32, chunks of {auto_chunk_rows(V)} tokens")
    print("| entropy | CPU s (median) | all | GFLOP/s |\n|---|---|---|---|")
    for c, t in res.items():
        m = statistics.median(t)
        print(f"| {'in the loss (coef 0.01)' if c else 'returned, not in the loss'} | {m:.2f} | "
              f"{' '.join(f'{x:.2f}' for x in t)} | {flop / m / 1e9:.0f} |")


def sampling(rows: int, rounds: int) -> None:
    logits = (torch.randn(rows, V, generator=torch.Generator().manual_seed(1)) * 3).bfloat16()

    def old():
        logp = sampling_log_probs(logits.float(), 1.0)
        tok = sample_inverse_cdf(logp.exp())
        return logp.gather(-1, tok[:, None])

    def new():
        return sample_large_vocab(logits.float(), 1.0)

    res = {"log-softmax path": [], "sample_large_vocab": []}
    for r in range(rounds * 8):
        res["log-softmax path"].append(cpu_s(old))
        res["sample_large_vocab"].append(cpu_s(new))
    print(f"\nsampling one token per row, {rows} x {V} bf16 logits (fp32 copy included)")
    print("| path | ms per token (median) |\n|---|---|")
    for k, t in res.items():
        print(f"| {k} | {statistics.median(t) * 1e3:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=512, help="response tokens of the update (16 rows x 32)")
    ap.add_argument("--rows", type=int, default=16, help="rows decoding at once")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    print(f"threads {torch.get_num_threads()}")
    sampling(args.rows, args.rounds)
    head(args.tokens, args.rounds)


if __name__ == "__main__":
    main()
