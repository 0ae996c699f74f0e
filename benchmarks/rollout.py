"""Generation time of the rollout backends, hf (transformers generate) vs lean, in one process.

    python benchmarks/rollout.py            # both model sizes (a few minutes on 2 cores)
    python benchmarks/rollout.py --quick    # a smoke run

Models are built from config like `reinforge model` (character tokenizer): tiny = the 3M
default (hidden 256, 4 layers), 32 response tokens; small = hidden 512, 8 layers (15.0M), 128
response tokens. Each call generates 4 prompts x 8 samples at temperature 1 with
rollout.ignore_eos, so every backend produces exactly the same number of tokens. Calls alternate
between backends (the machine is shared and noisy), and the table prints the median seconds per
call over --repeats calls after a warm-up, tokens/s, and hf / lean.

    python benchmarks/rollout.py --model runs/demo/grpo/hf   # a trained folder, the demo's shape

--model times a model folder in the demo's rollout shape instead: 32 two-digit additions x 8
samples, 5 tokens, EOS honoured (rows stop at different steps: lean drops finished rows,
generate() computes them until every row is done), so tokens/s counts generated tokens.
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


def time_backends(model, tok, texts: list[str], T: int, n: int, repeats: int,
                  ignore_eos: bool = True) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """Seconds per generate() call of each backend and generated tokens per call, calls
    alternating; the first call of each is a warm-up."""
    prompts = Batch({"uid": torch.arange(len(texts))},
                    {"prompt_ids": [tok.encode(p, add_special_tokens=False) for p in texts]})
    backends = {name: cls(model, tok, max_prompt_length=P, max_response_length=T, ignore_eos=ignore_eos)
                for name, cls in (("hf", HFRollout), ("lean", LeanRollout))}
    times: dict[str, list[float]] = {name: [] for name in backends}
    tokens: dict[str, list[int]] = {name: [] for name in backends}
    for r in range(repeats + 1):
        for name, rollout in backends.items():
            t0 = time.perf_counter()
            out = rollout.generate(prompts, n=n, temperature=1.0)
            if r:
                times[name].append(time.perf_counter() - t0)
                tokens[name].append(int(out["response_mask"].sum()))
    return times, tokens


def print_row(label: str, params: float, T: int, times: dict, tokens: dict) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    tok_s = {k: statistics.median(tokens[k]) / med[k] for k in med}
    print(f"{label:>6} {params:>6.1f}M {T:>4} {med['hf']:>7.3f} {med['lean']:>7.3f} {tok_s['hf']:>9.0f} "
          f"{tok_s['lean']:>10.0f} {med['hf'] / med['lean']:>7.2f}x")
    print(f"{'':>6} per-call ratios: " + ", ".join(f"{h / l:.2f}" for h, l in zip(times["hf"], times["lean"])))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--model", default=None, help="a model folder, timed in the demo's shape (see above)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (the demo runs with 1)")
    ap.add_argument("--quick", action="store_true", help="2 repeats, 8 tokens")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    repeats = 2 if args.quick else args.repeats
    header = f"{'model':>6} {'params':>7} {'T':>4} {'hf s':>7} {'lean s':>7} {'hf tok/s':>9} {'lean tok/s':>10} {'hf/lean':>8}"
    if args.model:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model, tok = AutoModelForCausalLM.from_pretrained(args.model).eval(), AutoTokenizer.from_pretrained(args.model)
        g = torch.Generator().manual_seed(0)
        texts = [f"{a}+{b}=" for a, b in torch.randint(10, 100, (32, 2), generator=g).tolist()]
        print(f"torch threads: {torch.get_num_threads()}; {args.model}: 32 prompts x {args.n}, EOS honoured")
        print(header)
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print_row("demo", params, 5, *time_backends(model, tok, texts, 5, args.n, repeats, ignore_eos=False))
        return
    print(f"torch threads: {torch.get_num_threads()}; {len(PROMPTS)} prompts x {args.n}, ignore_eos")
    print(header)
    for size in args.sizes.split(","):
        kw, T = SIZES[size]
        T = 8 if args.quick else T
        model = make_tiny_model(tok, seed=0, **kw).eval()
        params = sum(p.numel() for p in model.parameters()) / 1e6
        print_row(size, params, T, *time_backends(model, tok, PROMPTS, T, args.n, repeats))


if __name__ == "__main__":
    main()
