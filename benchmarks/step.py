"""Per-stage time and tokens/s of one GRPO step on a ~3M-parameter model on CPU.

    python benchmarks/step.py [--steps 5] [--fused 1] [--override model.autocast=bf16 ...]

32 sequences (4 prompts x 8 samples), exactly 32 response tokens (rollout.ignore_eos), the GRPO
preset with its KL loss (on-policy: no old-log-prob pass). Prints a markdown table of median seconds per
stage over the measured steps (the first step is a warm-up and is not counted) and perf/mfu.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from reinforge.config.load import load_config
from reinforge.config.schema import RLConfig
from reinforge.models.tiny import make_tiny_model
from reinforge.tasks import build_char_tokenizer, make_task_data
from reinforge.trainers.rl import RLTrainer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--fused", type=int, default=1)
    ap.add_argument("--override", action="append", default=[], help="extra config override")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="reinforge_bench_"))
    tok = build_char_tokenizer()
    model = make_tiny_model(tok, str(tmp / "model"), seed=0)
    n_params = sum(p.numel() for p in model.parameters())
    data = make_task_data("arithmetic", str(tmp / "data"), n_train=256, n_test=8, n_sft=8, seed=0)
    cfg = load_config(RLConfig, "grpo", [
        f"model.path={tmp / 'model'}", f"data.train_files=[{data['train']}]", "data.max_prompt_length=16",
        "rollout.max_response_length=32", "data.train_batch_size=4", "rollout.n=8", "actor.micro_batch_size=16",
        f"trainer.total_steps={args.steps + 1}", f"trainer.run_dir={tmp / 'run'}", "trainer.loggers=[]",
        "reward.functions=[{name: arithmetic}]", f"model.fused_logprobs={bool(args.fused)}",
        "rollout.ignore_eos=true", *args.override])
    trainer = RLTrainer(cfg)
    rows = []
    for i in range(args.steps + 1):
        trainer.step_idx += 1
        t0 = time.perf_counter()
        m = trainer.step()
        m["timing_s/step"] = time.perf_counter() - t0
        if i > 0:
            rows.append(m)
    stages = [k for k in rows[0] if k.startswith("timing_s/")]
    print(f"\nOne GRPO step, {n_params / 1e6:.2f}M-parameter Qwen2, 32 sequences x <= 32 response tokens, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, fused log-probs={bool(args.fused)}"
          f"{', ' + ' '.join(args.override) if args.override else ''}")
    print(f"median of {len(rows)} steps (after 1 warm-up)\n")
    print("| stage | seconds | share |\n|---|---|---|")
    total = statistics.median(r["timing_s/step"] for r in rows)
    for k in stages:
        v = statistics.median(r[k] for r in rows)
        print(f"| {k.split('/', 1)[1]} | {v:.3f} | {100 * v / total:.0f}% |")
    tokens = statistics.median(r["response_length/mean"] for r in rows) * 32
    print(f"\nresponse tokens per step: {tokens:.0f}; all tokens/s (perf/throughput): "
          f"{statistics.median(r['perf/throughput'] for r in rows):.0f}; response tokens/s: {tokens / total:.0f}; "
          f"perf/mfu: {statistics.median(r['perf/mfu'] for r in rows):.3f}")


if __name__ == "__main__":
    main()
