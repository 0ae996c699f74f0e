"""GPU check of the vLLM rollout: a few GRPO steps with rollout.backend=vllm (skipped in CI).

    python scripts/gpu_vllm_check.py                      # tiny Qwen2 built on the fly
    python scripts/gpu_vllm_check.py --model /models/Qwen2.5-0.5B-Instruct --steps 5

Prints one row per step (rollout/trainer log-prob gap, TIS weights, reward) and exits non-zero
if a step's metrics are not finite or the gap is implausibly large (a weight-sync bug shows up
as a gap that grows after the first update). Exits 77 (skipped: nothing was checked, which must
not read as a pass) when there is no GPU or no vllm; a metric it checks that was not reported
fails the check by name.
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

EXIT_SKIPPED = 77  # automake's "skipped"
KEYS = ["rollout_corr/logprob_gap_abs_mean", "rollout_corr/logprob_gap_max", "rollout_corr/tis_weight_mean",
        "rollout_corr/tis_clip_frac", "critic/score/mean"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="local HF model folder (default: a tiny Qwen2)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--max-gap", type=float, default=0.5, help="fail above this mean |old - rollout| log-prob")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device; nothing was checked")
        return EXIT_SKIPPED
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("SKIPPED: vllm is not installed (pip install 'reinforge[vllm]'); nothing was checked")
        return EXIT_SKIPPED
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.tasks import build_char_tokenizer, make_task_data
    from reinforge.trainers.rl import RLTrainer

    work = Path(tempfile.mkdtemp(prefix="vllm_check_"))
    model = args.model
    if model is None:
        from reinforge.models.tiny import make_tiny_model

        model = str(work / "tiny")
        make_tiny_model(build_char_tokenizer(), model, seed=0)
    data = make_task_data("arithmetic", str(work / "data"), n_train=256, n_test=16, n_sft=8, seed=0, digits=1)
    overrides = [f"model.path={model}", f"data.train_files=[{data['train']}]", f"data.val_files=[{data['test']}]",
                 "rollout.backend=vllm", "rollout.gpu_memory_utilization=0.3", f"trainer.total_steps={args.steps}",
                 f"trainer.run_dir={work / 'run'}", "trainer.loggers=[jsonl]", "trainer.progress=false",
                 "trainer.report=false", "trainer.val_before_train=false", "data.train_batch_size=8", "rollout.n=4"]
    trainer = RLTrainer(load_config(RLConfig, "grpo", overrides))
    problems = []
    print("| step | gap mean | gap max | tis weight | tis clip | score |")
    print("|---:|---:|---:|---:|---:|---:|")
    for step in range(1, args.steps + 1):
        trainer.step_idx = step
        m = trainer.step()
        vals = [m.get(k, float("nan")) for k in KEYS]
        print(f"| {step} | " + " | ".join(f"{v:.4f}" for v in vals) + " |")
        missing = [k for k in KEYS if k not in m]
        if missing:
            problems.append(f"step {step}: metrics {missing} were not reported")
        elif not all(math.isfinite(v) for v in vals):
            problems.append(f"step {step}: a non-finite metric")
        elif vals[0] > args.max_gap:
            problems.append(f"step {step}: mean |log-prob gap| {vals[0]:.4f} > --max-gap {args.max_gap}")
    for p in problems:
        print(f"FAILED: {p}")
    ok = not problems
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
