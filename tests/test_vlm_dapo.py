"""DAPO on image prompts (a tiny Qwen2-VL): dynamic sampling drops the groups whose rewards are
all equal and generates more rounds; the kept rows of several rounds, concatenated, still carry
their own prompt's images (the same PromptImages object as their prompt), the old log-probs
computed on that batch equal the rollout's (a row paired with another prompt's image would not),
and overlong filtering and the step run on it."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from reinforge.config.load import load_config
from reinforge.config.schema import RLConfig
from tests.test_vlm_train import _overrides, vlm_setup  # noqa: F401 (a fixture)

# 1 for every sample of an odd answer's prompt (a flat group: dropped), mixed rewards otherwise
REWARD = f"{Path(__file__).parent / 'reward_fns.py'}:flat_on_odd_answers"


def test_dapo_dynamic_sampling_keeps_each_rows_images(vlm_setup, tmp_path):  # noqa: F811
    from reinforge.trainers.rl import RLTrainer

    model, verl_file, _ = vlm_setup
    cfg = load_config(RLConfig, "dapo", _overrides(model, verl_file, str(tmp_path / "run"), **{
        "reward.functions": f"[{{name: '{REWARD}'}}]", "rollout.max_response_length": 4,
        "algorithm.overlong_buffer_len": 2, "actor.mini_batch_size": 4, "algorithm.max_gen_rounds": 4}))
    trainer = RLTrainer(cfg)
    prompts_of, seen = {}, {}
    generate, log_probs = trainer.rollout.generate, trainer.actor.log_probs

    def record_generate(prompts, **kw):
        for uid, v, ids, gt in zip(prompts["uid"].tolist(), prompts["vision"], prompts["prompt_ids"],
                                   prompts["ground_truth"]):
            prompts_of[uid] = (v, ids, gt)
        return generate(prompts, **kw)

    def record_log_probs(batch, **kw):
        seen["batch"], seen["old"] = batch, log_probs(batch, **kw)
        return seen["old"]

    trainer.rollout.generate, trainer.actor.log_probs = record_generate, record_log_probs
    trainer.fit()
    step = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert step["dynamic_sampling/gen_rounds"] >= 2 and step["dynamic_sampling/kept_ratio"] < 1  # groups dropped
    assert step["dynamic_sampling/batch_fill"] == 1.0
    for key in ("actor/pg_loss", "actor/grad_norm", "overlong/filtered_frac"):
        assert math.isfinite(step[key]), key
    b = seen["batch"]
    assert len(b) == 2 * 4 and len(prompts_of) > 2  # two kept groups out of more prompts
    image_token = trainer.processor.image_token_id
    P = cfg.data.max_prompt_length
    for i, uid in enumerate(b["group_ids"].tolist()):
        vision, ids, gt = prompts_of[uid]
        assert b["vision"][i] is vision, f"row {i} carries another prompt's images"
        assert int(gt) % 2 == 0  # a flat (odd-answer) group was not kept
        prompt = b["input_ids"][i, :P][b["attention_mask"][i, :P].bool()].tolist()
        assert prompt == list(ids)
        merge = 4  # 2x2 merged patches per image token
        assert prompt.count(image_token) * merge == int(vision.image_grid_thw.prod(-1).sum())
    mask = b["response_mask"].bool()
    old, behaviour = seen["old"]["old_log_probs"][mask], b["rollout_log_probs"][mask]
    assert torch.allclose(old, behaviour, atol=1e-4), (old - behaviour).abs().max()
