"""What this machine can do at a model's shapes: memory bandwidth and matmul peaks, and the floors
they put under a GRPO step's stages (benchmarks/vs_trl.py prints them next to the measured times).

    python benchmarks/floors.py [--hidden 896 --inter 4864 --vocab 151936 --rows 16 --tokens 608] [--threads 2]
    python benchmarks/floors.py --shape smollm2      # vs_trl's smollm2 row: 16 x 576 x 1536, 2,032 tokens

- bandwidth: bytes/s of summing a 1 GiB fp32 tensor (a read-only stream, what decoding does
  to its weights), best of 5;
- matmul peak at a shape: FLOP/s of (m, hidden) @ (hidden, inter), best of 5 (after a warm-up),
  the better of torch.mm and oneDNN's prepacked product, in fp32 and bf16: m = rows at the decode shape (one token of every row), m = tokens at the
  update shape (every token of the batch);
- generation floor, per response token: max(weight bytes / bandwidth, 2 N rows / decode peak)
  in the precision it decodes in; update floor: 6 N tokens / update peak (forward + backward);
- memory floor: 16 bytes per parameter (fp32 weights, gradients, AdamW's two moments) plus the
  largest activation, taken as the update batch's fp32 logits (tokens x V x 4 bytes: the one
  tensor a logits-path step builds whole).
"""
from __future__ import annotations

import argparse
import time

import torch


def _best(fn, reps: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def bandwidth() -> float:
    """Read bandwidth, bytes/s: best of 5 sums of a 1 GiB fp32 tensor."""
    x = torch.ones(1 << 28)
    return x.numel() * 4 / _best(lambda: x.sum())


def matmul_peak(m: int, k: int, n: int, dtype: torch.dtype) -> float:
    """FLOP/s of (m, k) @ (k, n) in `dtype`, best of 5 (repeated to ~>= 20 ms per timing), the
    better of torch.mm and, on a CPU with oneDNN, the product with the weight reordered once
    into oneDNN's layout (the lean decode loop's kernel, workers/rollout/packed_linears.py: in
    fp32 it runs ~2x the BLAS at the decode shape here, so a floor from torch.mm alone would
    sit above what the loop achieves)."""
    from reinforge.workers.rollout import packed_linears

    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(k, n, generator=g).to(dtype)
    reps = max(1, int(2e9 // (2 * m * k * n)))

    def run():
        for _ in range(reps):
            torch.mm(a, b)

    best = _best(run)
    if packed_linears.available():
        w = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), m)

        def run_packed():
            for _ in range(reps):
                torch.ops.mkldnn._linear_pointwise(a, w, None, "none", [], "")

        best = min(best, _best(run_packed))
    return 2 * m * k * n * reps / best


def measure(hidden: int, inter: int, rows: int, tokens: int) -> dict:
    """Bandwidth and fp32 / bf16 peaks at the decode (rows) and update (tokens) shapes."""
    out = {"bandwidth": bandwidth()}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        out[f"decode_{name}"] = matmul_peak(rows, hidden, inter, dt)
        out[f"update_{name}"] = matmul_peak(tokens, hidden, inter, dt)
    return out


def gen_floor_s(n_params: int, n_matmul: int, rows: int, response_tokens: int, peaks: dict, precision: str) -> float:
    """Seconds to decode `response_tokens` tokens of `rows` rows at the floor of `precision`."""
    bytes_per = 4 if precision == "fp32" else 2
    per_token = max(n_params * bytes_per / peaks["bandwidth"], 2 * n_matmul * rows / peaks[f"decode_{precision}"])
    return response_tokens * per_token


def update_floor_s(n_matmul: int, tokens: int, peaks: dict, precision: str) -> float:
    """Seconds of one forward + backward over `tokens` tokens at the update-shape peak of `precision`."""
    return 6 * n_matmul * tokens / peaks[f"update_{precision}"]


def memory_floor_gb(n_params: int, tokens: int, vocab: int) -> float:
    """16 bytes per parameter plus the batch's fp32 logits, GB."""
    return (16 * n_params + 4 * tokens * vocab) / 1e9


SHAPES = {"qwen0.5b": dict(hidden=896, inter=4864, rows=16, tokens=608),
          "smollm2": dict(hidden=576, inter=1536, rows=16, tokens=16 * (63 + 64))}
"""vs_trl.py's real-shape rows: widths, rows (prompts x samples) and update tokens (rows x
(longest prompt + response tokens)); smollm2's prompts are <= 63 tokens, its responses 64."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=list(SHAPES), help="a vs_trl row's shape (overrides the four below)")
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--inter", type=int, default=4864)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=608)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.shape:
        vars(args).update(SHAPES[args.shape])
    if args.threads:
        torch.set_num_threads(args.threads)
    p = measure(args.hidden, args.inter, args.rows, args.tokens)
    print(f"bandwidth {p['bandwidth'] / 1e9:.0f} GB/s; matmul GFLOP/s ({args.rows}|{args.tokens} x {args.hidden} x "
          f"{args.inter}): decode fp32 {p['decode_fp32'] / 1e9:.0f}, bf16 {p['decode_bf16'] / 1e9:.0f}; "
          f"update fp32 {p['update_fp32'] / 1e9:.0f}, bf16 {p['update_bf16'] / 1e9:.0f}")


if __name__ == "__main__":
    main()
