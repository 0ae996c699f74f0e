"""GPU check of the vLLM rollout: a few GRPO steps with rollout.backend=vllm (skipped in CI).

    python scripts/gpu_vllm_check.py                      # tiny Qwen2 built on the fly
    python scripts/gpu_vllm_check.py --model /models/Qwen2.5-0.5B-Instruct --steps 5

Prints one row per step (rollout/trainer log-prob gap, TIS weights, reward) and exits non-zero
if a step's metrics are not finite or the gap is implausibly large (a weight-sync bug shows up
as a gap that grows after the first update). Exits 0 with a message when no GPU or no vllm.
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="local HF model folder (default: a tiny Qwen2)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--max-gap", type=float, default=0.5, help="fail above this mean |old - rollout| log-prob")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 0
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("skipped: vllm is not installed (pip install 'reinforge[vllm]')")
        return 0
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
    ok = True
    print("| step | gap mean | gap max | tis weight | tis clip | score |")
    print("|---:|---:|---:|---:|---:|---:|")
    for step in range(1, args.steps + 1):
        trainer.step_idx = step
        m = trainer.step()
        keys = ["rollout_corr/logprob_gap_abs_mean", "rollout_corr/logprob_gap_max", "rollout_corr/tis_weight_mean",
                "rollout_corr/tis_clip_frac", "critic/score/mean"]
        vals = [m.get(k, float("nan")) for k in keys]
        print(f"| {step} | " + " | ".join(f"{v:.4f}" for v in vals) + " |")
        ok &= all(math.isfinite(v) for v in vals) and vals[0] <= args.max_gap
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
