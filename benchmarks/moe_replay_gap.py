"""The train-inference log-prob gap of an MoE policy with and without rollout routing replay.

    python benchmarks/moe_replay_gap.py MODEL_DIR DATA_DIR [--steps 3] [--out DIR]

MODEL_DIR: an MoE policy (e.g. `reinforge demo --moe`'s SFT base, runs/demo_moe/sft/hf);
DATA_DIR: its task data (runs/demo_moe/data). Two measurements, one torch thread:

1. GRPO runs of `--steps` steps (the demo's preset, 32 prompts x 8 samples) from MODEL_DIR with
   a bf16 lean rollout (rollout.dtype=bfloat16, so truncated IS runs and the actor logs
   rollout_corr/*: the gap between its fp32 old log-probs and the rollout's), with
   actor.router_replay=disabled and =rollout, the same seed: the table prints the per-step means of
   rollout_corr/logprob_gap_abs_mean and the maximum of rollout_corr/logprob_gap_max.
2. One bf16 and one fp32 rollout of 32 prompts x 8, the trainer's fp32 forward with and without
   replay: the largest |trainer - rollout| log-prob over the response tokens (fp32 with replay:
   bounded by 1e-5 in tests/test_moe.py), and how often the trainer's own routing differs from
   the rollout's.
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


def direct_gap(model_dir: str, data: Path, dtype: str) -> dict:
    """One lean rollout (32 prompts x 8, `dtype` decoding) and the fp32 trainer forward with and
    without replay -> the largest |trainer - rollout| log-prob of each, and the share of
    (token, layer) routing choices (response tokens) where the trainer's own top-k set differs
    from the rollout's."""
    import pandas as pd

    from reinforge.models.forward import response_logprobs
    from reinforge.models.loading import load_causal_lm, load_tokenizer
    from reinforge.models.moe import attach_routing, select_for, unrouted
    from reinforge.protocol import Batch
    from reinforge.workers.rollout.lean import LeanRollout

    model, tok = load_causal_lm(model_dir, dtype="float32"), load_tokenizer(model_dir)
    routing = attach_routing(model, replay=True)
    prompts = pd.read_parquet(data / "train.parquet")["prompt"].head(32)  # the demo's: plain text ("40+87=")
    ids = [tok.encode(p) for p in prompts]
    torch.manual_seed(0)
    batch = LeanRollout(model, tok, max_prompt_length=8, max_response_length=5, dtype=dtype).generate(
        Batch({"uid": torch.arange(len(ids))}, {"prompt_ids": ids}), n=8)
    out, resp = {}, batch["response_mask"].bool()
    for replay in (False, True):
        routing.replay_enabled = replay
        select_for(model, batch, capture=not replay)
        with torch.no_grad():
            lp = response_logprobs(model, batch["input_ids"], batch["attention_mask"], 5)[0]
        if not replay:  # the trainer's own choice per layer (N, k) -> (B, S, layers, k)
            own = torch.stack(routing.take_captured()[1], dim=1).view(*batch["routed_experts"].shape)
            rec = batch["routed_experts"].long()
            cols = torch.cat([torch.zeros_like(batch["prompts"], dtype=torch.bool), resp], dim=1)  # (B, S)
            cols = cols & (rec[:, :, 0, 0] != unrouted(batch["routed_experts"].dtype))  # a row's last token: never fed
            same = (own.sort(-1).values == rec.sort(-1).values).all(-1)  # (B, S, layers)
            out["flip_frac"] = float((~same)[cols].float().mean())
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
        res = {r: grpo_gap(a.model_dir, Path(a.data_dir), r, a.steps, root / f"replay_{r}") for r in ("disabled", "rollout")}
    direct = {d: direct_gap(a.model_dir, Path(a.data_dir), d) for d in ("bfloat16", "model")}
    print(f"bf16 rollout, fp32 trainer, {a.steps} GRPO steps each (rollout_corr/*):")
    print(f"{'router_replay':<15}{'gap_abs_mean':>14}{'gap_max':>10}{'tis_clip_frac':>15}")
    for r, m in res.items():
        print(f"{r:<15}{m['gap_abs_mean']:>14.2e}{m['gap_max']:>10.4f}{m['tis_clip_frac']:>15.2e}")
    print("one rollout of 32 prompts x 8, fp32 trainer forward: largest |trainer - rollout| log-prob, and the share "
          "of response tokens' (token, layer) expert sets the trainer would choose differently:")
    for d, m in direct.items():
        print(f"  rollout {'fp32' if d == 'model' else d}: replay disabled {m['off']:.2e}, replay {m['replay']:.2e}, "
              f"routing differs {m['flip_frac']:.2%}")


if __name__ == "__main__":
    main()
