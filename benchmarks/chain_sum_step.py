"""What one GRPO step of the chain_sum demo costs on SmolLM2-135M-Instruct, setting by setting.

    OMP_NUM_THREADS=1 python benchmarks/chain_sum_step.py [--steps 2] [--settings grpo,nockpt,...]

The demo's data (reasoning-gym chain_sum, 3 terms of 1 digit, its short system message) and 8
prompts x 8 samples, every response exactly --response tokens long (rollout.ignore_eos), so each
setting does the same work. Per setting: the median over the measured steps (after 1 warm-up)
of each stage's wall seconds and of the step's process CPU seconds (user + system, getrusage),
the number the demo's budget is in; the machine may be loaded, so CPU seconds are the fairer
comparison. Settings (each adds to the GRPO preset, lr 1e-5, no KL):

    grpo      the preset's defaults at this size: gradient checkpointing on (auto, >= 100M
              parameters on a CPU), bf16 autocast, bf16 decoding, one micro-batch of 64
    nockpt    gradient checkpointing off, micro-batches of 16, each row forwarded whole
    shared    nockpt with model.share_prompt (each distinct prompt of a micro-batch forwarded
              once, its 8 responses on its key/value cache: models/shared_prompt.py)
    frozen    nockpt with the tied embedding / LM head (49,152 x 576) frozen: no gradient for it
              and no AdamW update (set on the loaded model; no config key does this)
    fp32      nockpt in fp32 (no autocast, fp32 decoding)
"""
from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

from reinforge.cli.demo_chain_sum import TASK
from reinforge.config.load import load_config
from reinforge.config.schema import RLConfig
from reinforge.data.reasoning_gym import make_reasoning_gym_data
from reinforge.models.pretrained import pretrained_folder
from reinforge.trainers.rl import RLTrainer

SETTINGS = {
    "grpo": [],
    "nockpt": ["model.gradient_checkpointing=false", "actor.micro_batch_size=16", "model.share_prompt=false"],
    "shared": ["model.gradient_checkpointing=false", "actor.micro_batch_size=16", "model.share_prompt=true"],
    "frozen": ["model.gradient_checkpointing=false", "actor.micro_batch_size=16", "model.share_prompt=false"],
    "fp32": ["model.gradient_checkpointing=false", "actor.micro_batch_size=16", "model.autocast=none",
             "rollout.dtype=model", "model.share_prompt=false"],
}


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def measure(name: str, model: Path, data: dict, tmp: Path, steps: int, response: int) -> dict:
    cfg = load_config(RLConfig, "grpo", [
        f"model.path={model}", f"data.train_files=[{data['train']}]", "data.max_prompt_length=64",
        f"rollout.max_response_length={response}", "rollout.ignore_eos=true", "data.train_batch_size=8", "rollout.n=8",
        "actor.use_kl_loss=false", "reward.functions=[{name: reinforge.cli.demo_chain_sum:chain_sum_reward}]",
        f"trainer.total_steps={steps + 1}", f"trainer.run_dir={tmp / name}", "trainer.loggers=[]",
        "trainer.progress=false", *SETTINGS[name]])
    trainer = RLTrainer(cfg)
    if name == "frozen":
        trainer.actor.model.get_input_embeddings().weight.requires_grad_(False)  # tied: the LM head too
    rows = []
    try:
        for i in range(steps + 1):
            trainer.step_idx += 1
            t0, c0 = time.perf_counter(), cpu_s()
            m = trainer.step()
            m["timing_s/step"], m["cpu_s/step"] = time.perf_counter() - t0, cpu_s() - c0
            if i > 0:
                rows.append(m)
    finally:
        trainer.close()
    keys = [k for k in rows[0] if k.startswith("timing_s/")] + ["cpu_s/step"]
    return {k: statistics.median(r[k] for r in rows) for k in keys}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--response", type=int, default=24)
    ap.add_argument("--settings", default="grpo,nockpt,shared,frozen,fp32")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="reinforge_chain_sum_step_"))
    data = make_reasoning_gym_data(TASK["task"], str(tmp / "data"), n_train=256, n_test=8, seed=0,
                                   instruction=TASK["instruction"], system=TASK["system"], options=TASK["options"])
    model = pretrained_folder("smollm2-135m-instruct")
    results = {name: measure(name, model, data, tmp, args.steps, args.response) for name in args.settings.split(",")}
    stages = list(next(iter(results.values())))
    print(f"\nOne GRPO step of SmolLM2-135M-Instruct, 8 prompts x 8 samples x {args.response} response tokens, "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); median of {args.steps} steps after "
          "1 warm-up; wall seconds per stage, process CPU seconds per step\n")
    print("| stage | " + " | ".join(results) + " |\n|---|" + "---|" * len(results))
    for k in stages:
        print(f"| {k} | " + " | ".join(f"{r[k]:.1f}" for r in results.values()) + " |")


if __name__ == "__main__":
    main()
