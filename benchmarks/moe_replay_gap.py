"""The train-inference log-prob gap of an MoE policy with and without rollout routing replay.

    python benchmarks/moe_replay_gap.py MODEL_DIR DATA_DIR [--steps 3] [--out DIR]

MODEL_DIR: an MoE policy (e.g. `reinforge demo --moe`'s SFT base, runs/demo_moe/sft/hf);
DATA_DIR: its task data (runs/demo_moe/data). Two measurements, one torch thread:

1. GRPO runs of `--steps` steps (the demo's preset, 32 prompts x 8 samples) from MODEL_DIR with
   a bf16 lean rollout (rollout.dtype=bfloat16, so truncated IS runs and the actor logs
   rollout_corr/*: the gap between its fp32 old log-probs and the rollout's), with
   actor.router_replay=off and =rollout, the same seed: the table prints the per-step means of
   rollout_corr/logprob_gap_abs_mean and the maximum of rollout_corr/logprob_gap_max.
2. One fp32 rollout of the same prompts, the trainer's forward with and without replay: the
   largest |trainer - rollout| log-prob over the response tokens (replay: bounded by 1e-5 in
   tests/test_moe.py).
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch


def grpo_gap(model_dir: str, data: Path, replay: str, steps: int, run_dir: Path) -> dict:
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.rl import RLTrainer

    cfg = load_config(RLConfig, "demo_grpo", [
        f"model.path={model_dir}", f"data.train_files=[{data / 'train.parquet'}]", f"data.val_files=[{data / 'test.parquet'}]",
        f"trainer.run_dir={run_dir}", f"trainer.total_steps={steps}", "trainer.val_before_train=false",
        "trainer.val_every=0", "trainer.export_hf=false", "trainer.report=false", "trainer.progress=false",
        "trainer.loggers=[jsonl]", "rollout.dtype=bfloat16", f"actor.router_replay={replay}"])
    RLTrainer(cfg).fit(overwrite=True)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["step"] > 0]
    return {"gap_abs_mean": sum(r["rollout_corr/logprob_gap_abs_mean"] for r in rows) / len(rows),
            "gap_max": max(r["rollout_corr/logprob_gap_max"] for r in rows),
            "tis_clip_frac": sum(r["rollout_corr/tis_clip_frac"] for r in rows) / len(rows)}


def fp32_gap(model_dir: str, data: Path) -> dict:
    import pandas as pd

    from reinforge.models.forward import response_logprobs
    from reinforge.models.loading import load_causal_lm, load_tokenizer
    from reinforge.models.moe import attach_routing, select_for
    from reinforge.protocol import Batch
    from reinforge.workers.rollout.lean import LeanRollout

    model, tok = load_causal_lm(model_dir, dtype="float32"), load_tokenizer(model_dir)
    routing = attach_routing(model, replay=True)
    prompts = pd.read_parquet(data / "train.parquet")["prompt"].head(32)  # the demo's: plain text ("40+87=")
    ids = [tok.encode(p) for p in prompts]
    torch.manual_seed(0)
    batch = LeanRollout(model, tok, max_prompt_length=8, max_response_length=5).generate(
        Batch({"uid": torch.arange(len(ids))}, {"prompt_ids": ids}), n=8)
    out, resp = {}, batch["response_mask"].bool()
    for replay in (False, True):
        routing.replay_enabled = replay
        select_for(model, batch)
        with torch.no_grad():
            lp = response_logprobs(model, batch["input_ids"], batch["attention_mask"], 5)[0]
        routing.clear()
        out["replay" if replay else "off"] = float((lp - batch["rollout_log_probs"])[resp].abs().max())
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("data_dir")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default=None, help="run folders (default: a temporary directory)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(a.out or tmp)
        res = {r: grpo_gap(a.model_dir, Path(a.data_dir), r, a.steps, root / f"replay_{r}") for r in ("off", "rollout")}
    fp = fp32_gap(a.model_dir, Path(a.data_dir))
    print(f"bf16 rollout, fp32 trainer, {a.steps} GRPO steps each (rollout_corr/*):")
    print(f"{'router_replay':<15}{'gap_abs_mean':>14}{'gap_max':>10}{'tis_clip_frac':>15}")
    for r, m in res.items():
        print(f"{r:<15}{m['gap_abs_mean']:>14.2e}{m['gap_max']:>10.4f}{m['tis_clip_frac']:>15.2e}")
    print(f"fp32 rollout, largest |trainer - rollout| log-prob: replay off {fp['off']:.2e}, replay {fp['replay']:.2e}")


if __name__ == "__main__":
    main()
