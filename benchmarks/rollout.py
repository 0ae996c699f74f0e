"""Generation time of the rollout backends, hf (transformers generate), lean and vllm, in one process.

    python benchmarks/rollout.py            # both model sizes (a few minutes on 2 cores)
    python benchmarks/rollout.py --quick    # a smoke run
    .venv-vllm/bin/python benchmarks/rollout.py --backends lean,vllm --sizes tiny,small --dtypes float32,bfloat16
    .venv-vllm/bin/python benchmarks/rollout.py --backends lean,vllm --sizes qwen0.5b --repeats 3

vllm runs where vLLM is installed (its CPU build: `make vllm-venv`): the real engine in this
process (VLLMRollout, the model saved to a temporary folder it loads), with its defaults
(compiled, no enforce_eager) and a 1 GiB KV cache; its build and first (compiling) call are
outside the timings. qwen0.5b is the Qwen2.5-0.5B shape (24 layers, hidden 896) with the real
151,936-id vocabulary and tokenizer (`reinforge model --arch qwen2.5-0.5b`, random weights);
--dtypes times each shape in each dtype (bfloat16: the weights cast, both engines decode in it).

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
import gc
import os
import statistics
import sys
import tempfile
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


def make_backends(names: list[str], model, tok, T: int, folder: str | None, ignore_eos: bool = True) -> dict:
    """name -> rollout over `model` (vllm: an engine loading `folder`, the same weights)."""
    out = {}
    for name in names:
        if name == "vllm":
            from reinforge.workers.rollout.vllm import VLLMRollout

            out[name] = VLLMRollout(model, tok, max_prompt_length=P, max_response_length=T, model_path=folder,
                                    ignore_eos=ignore_eos, seed=0, cpu_kv_cache_gb=1.0)
        else:
            cls = {"hf": HFRollout, "lean": LeanRollout}[name]
            out[name] = cls(model, tok, max_prompt_length=P, max_response_length=T, ignore_eos=ignore_eos)
    return out


def time_backends(backends: dict, tok, texts: list[str], n: int,
                  repeats: int) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """Seconds per generate() call of each backend and generated tokens per call, calls
    alternating; the first call of each is a warm-up."""
    prompts = Batch({"uid": torch.arange(len(texts))},
                    {"prompt_ids": [tok.encode(p, add_special_tokens=False) for p in texts]})
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
    """Median seconds a call and tokens/s per backend, then lean's ratio to each other backend
    (other / lean > 1: lean is faster) with the per-call ratios."""
    med = {k: statistics.median(v) for k, v in times.items()}
    cells = " ".join(f"{k} {med[k]:.3f} s {statistics.median(tokens[k]) / med[k]:.0f} tok/s" for k in med)
    ratios = "; ".join(f"{k}/lean {med[k] / med['lean']:.2f}x" for k in med if k != "lean" and "lean" in med)
    print(f"{label:>16} {params:>7.1f}M T={T:<4} {cells}  {ratios}")
    for k in med:
        if k != "lean" and "lean" in med:
            print(f"{'':>16} per-call {k}/lean: " + ", ".join(f"{a / b:.2f}" for a, b in zip(times[k], times["lean"])))


def build_shape(size: str, dtype: str, folder: str):
    """(model, tokenizer, prompts, T) of a benchmark shape, saved into `folder` for vLLM."""
    if size == "qwen0.5b":
        from reinforge.models.archs import save_arch
        from reinforge.models.loading import load_tokenizer

        model = save_arch("qwen2.5-0.5b", folder, seed=0)
        tok = load_tokenizer(folder)
        T = 32
    else:
        tok = build_char_tokenizer()
        kw, T = SIZES[size]
        model = make_tiny_model(tok, folder, seed=0, **kw)
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
        model.save_pretrained(folder)
    return model.eval(), tok, PROMPTS, T


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--n", type=int, default=8, help="samples per prompt")
    ap.add_argument("--sizes", default="tiny,small", help="tiny, small, qwen0.5b")
    ap.add_argument("--dtypes", default="float32", help="float32, bfloat16 (comma-separated)")
    ap.add_argument("--backends", default="hf,lean", help="hf, lean, vllm (comma-separated)")
    ap.add_argument("--model", default=None, help="a model folder, timed in the demo's shape (see above)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads (the demo runs with 1)")
    ap.add_argument("--quick", action="store_true", help="2 repeats, 8 tokens")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    names = args.backends.split(",")
    repeats = 2 if args.quick else args.repeats
    if args.model:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model, tok = AutoModelForCausalLM.from_pretrained(args.model).eval(), AutoTokenizer.from_pretrained(args.model)
        g = torch.Generator().manual_seed(0)
        texts = [f"{a}+{b}=" for a, b in torch.randint(10, 100, (32, 2), generator=g).tolist()]
        print(f"torch threads: {torch.get_num_threads()}; {args.model}: 32 prompts x {args.n}, EOS honoured")
        params = sum(p.numel() for p in model.parameters()) / 1e6
        backends = make_backends(names, model, tok, 5, args.model, ignore_eos=False)
        print_row("demo", params, 5, *time_backends(backends, tok, texts, args.n, repeats))
        return
    print(f"torch threads: {torch.get_num_threads()}; {len(PROMPTS)} prompts x {args.n}, ignore_eos; "
          f"median seconds a call over {repeats} alternating calls")
    for size in args.sizes.split(","):
        for dtype in args.dtypes.split(","):
            with tempfile.TemporaryDirectory() as folder:
                model, tok, texts, T = build_shape(size, dtype, folder)
                T = 8 if args.quick else T
                backends = make_backends(names, model, tok, T, folder)
                params = sum(p.numel() for p in model.parameters()) / 1e6
                print_row(f"{size} {dtype}", params, T, *time_backends(backends, tok, texts, args.n, repeats))
                if "vllm" in backends:  # one in-process engine at a time (VLLMRollout.close)
                    backends["vllm"].close()
                del backends
                gc.collect()


if __name__ == "__main__":
    main()
