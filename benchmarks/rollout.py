"""Generation time of the rollout backends, hf (transformers generate) vs lean, in one process.

    python benchmarks/rollout.py            # both model sizes (a few minutes on 2 cores)
    python benchmarks/rollout.py --quick    # a smoke run

Models are built from config like `reinforge model` (character tokenizer): tiny = the 3M
default (hidden 256, 4 layers), 32 response tokens; small = hidden 512, 8 layers (~25M), 128
response tokens. Each call generates 4 prompts x 8 samples at temperature 1 with
rollout.ignore_eos, so every backend produces exactly the same number of tokens. Calls alternate
between backends (the machine is shared and noisy), and the table prints the median seconds per
call over --repeats calls after a warm-up, tokens/s, and hf / lean.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from reinforge.models.tiny import make_tiny_model  # noqa: E402
from reinforge.protocol import Batch  # noqa: E402
from reinforge.tasks import build_char_tokenizer  # noqa: E402
from reinforge.workers.rollout.hf import HFRollout  # noqa: E402
from reinforge.workers.rollout.lean import LeanRollout  # noqa: E402

SIZES = {"tiny": (dict(), 32), "small": (dict(hidden_size=512, num_layers=8), 128)}
PROMPTS = ["12+35=", "7*8=", "(4+5)*3=", "91-46="]
P = 16


def time_backends(model, tok, T: int, n: int, repeats: int) -> dict[str, list[float]]:
    """Seconds per generate() call of each backend, calls alternating; the first is a warm-up."""
    prompts = Batch({"uid": torch.arange(len(PROMPTS))},
                    {"prompt_ids": [tok.encode(p, add_special_tokens=False) for p in PROMPTS]})
    backends = {name: cls(model, tok, max_prompt_length=P, max_response_length=T, ignore_eos=True)
                for name, cls in (("hf", HFRollout), ("lean", LeanRollout))}
    times: dict[str, list[float]] = {name: [] for name in backends}
    for r in range(repeats + 1):
        for name, rollout in backends.items():
            t0 = time.perf_counter()
            out = rollout.generate(prompts, n=n, temperature=1.0)
            if r:
                times[name].append(time.perf_counter() - t0)
            assert out["response_mask"].sum() == len(PROMPTS) * n * T  # identical work
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (the demo runs with 1)")
    ap.add_argument("--quick", action="store_true", help="2 repeats, 8 tokens")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    print(f"torch threads: {torch.get_num_threads()}; {len(PROMPTS)} prompts x {args.n}, ignore_eos")
    print(f"{'model':>6} {'params':>7} {'T':>4} {'hf s':>7} {'lean s':>7} {'hf tok/s':>9} {'lean tok/s':>10} {'hf/lean':>8}")
    for size in args.sizes.split(","):
        kw, T = SIZES[size]
        T = 8 if args.quick else T
        model = make_tiny_model(tok, seed=0, **kw).eval()
        times = time_backends(model, tok, T, args.n, 2 if args.quick else args.repeats)
        med = {k: statistics.median(v) for k, v in times.items()}
        tokens = len(PROMPTS) * args.n * T
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"{size:>6} {params:>6.1f}M {T:>4} {med['hf']:>7.3f} {med['lean']:>7.3f} {tokens / med['hf']:>9.0f} "
              f"{tokens / med['lean']:>10.0f} {med['hf'] / med['lean']:>7.2f}x")
        print(f"{'':>6} per-call ratios: " + ", ".join(f"{h / l:.2f}" for h, l in zip(times["hf"], times["lean"])))


if __name__ == "__main__":
    main()
