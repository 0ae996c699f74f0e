"""One GRPO step of the local RL trainer on image prompts (a tiny Qwen2-VL): veRL's multimodal
schema (count_shapes' files) and TRL's (an `image` column beside `prompt`). The step's
forwards see the images (old log-probs == the rollout's behaviour log-probs), the vision tower
stays frozen while the language model trains, and what would drop the images is refused."""
from __future__ import annotations

import io
import json
import math

from pathlib import Path

import pytest
import torch
from PIL import Image

from reinforge.config.load import ConfigError, load_config
from reinforge.config.schema import RLConfig
from reinforge.data import load_rows, write_rows
from reinforge.tasks import make_task_data
from reinforge.trainers.rl import RLTrainer

REWARD = f"{Path(__file__).parent / 'reward_fns.py'}:odd_first_char"  # informative groups: weights move


@pytest.fixture(scope="module")
def vlm_setup(tmp_path_factory):
    from reinforge.models.vlm_tiny import make_tiny_vlm

    root = tmp_path_factory.mktemp("vlm_train")
    make_tiny_vlm(str(root / "model"), hidden_size=64, num_layers=2)
    files = make_task_data("count_shapes", str(root / "shapes"), n_train=8, n_test=2, n_sft=2, seed=0)
    trl = []  # the same pictures in TRL's schema: plain prompt messages, the image in its own column
    for row in load_rows(files["train"]):
        trl.append({"prompt": [{"role": "user", "content": "How many red shapes?"}],
                    "image": {"bytes": row["images"][0]["bytes"]},
                    "ground_truth": row["reward_model"]["ground_truth"], "data_source": "count_shapes"})
    trl_file = write_rows(trl, str(root / "trl" / "train.parquet"))
    return str(root / "model"), files["train"], trl_file


def _overrides(model: str, train: str, run_dir: str, **extra) -> list[str]:
    base = {"model.path": model, "data.train_files": f"[{train}]", "data.val_files": "[]",
            "data.max_prompt_length": 64, "rollout.max_response_length": 3, "data.train_batch_size": 2,
            "rollout.n": 4, "reward.functions": f"[{{name: '{REWARD}'}}]", "trainer.total_steps": 1, "trainer.run_dir": run_dir, "trainer.progress": False,
            "trainer.loggers": "[jsonl]", "actor.micro_batch_size": 8, "actor.lr": 1e-2,
            "trainer.val_before_train": False, "trainer.export_hf": False, "trainer.save_every": 0,
            "trainer.report": False}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _params(model, vision: bool) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in model.named_parameters() if ("visual" in k) == vision}


@pytest.mark.parametrize("schema", ["verl", "trl", "lora", "remax", "packing"])
def test_grpo_step_on_image_prompts(schema, vlm_setup, tmp_path):
    model, verl_file, trl_file = vlm_setup
    # veRL run: two mini-batches, so the separate old-log-prob pass runs; TRL run: on-policy,
    # validated on image prompts before and after, exported; LoRA: the reference is the actor
    # with its adapter off
    extra = {"verl": {"actor.mini_batch_size": 4},
             "trl": {"data.val_files": f"[{verl_file}]", "trainer.val_before_train": True, "rollout.val_n": 2,
                     "trainer.export_hf": True, "data.max_val_samples": 2},
             "lora": {"model.lora_rank": 4, "model.lora_target_modules": "[q_proj,v_proj]"},
             "remax": {},  # ReMax: a greedy baseline rollout on the same image prompts
             "packing": {"model.use_packing": True, "actor.mini_batch_size": 4}}[schema]  # packed log-prob forwards
    cfg = load_config(RLConfig, "remax" if schema == "remax" else "grpo", _overrides(model, trl_file if schema == "trl" else verl_file,
                                                   str(tmp_path / "run"), **extra))
    trainer = RLTrainer(cfg)
    assert trainer.plan.on_policy == (schema in ("trl", "lora"))  # remax: KL in the reward reads old log-probs
    tower, lm = _params(trainer.actor_model, True), _params(trainer.actor_model, False)
    assert tower and lm
    seen = {}
    rollout_generate, actor_log_probs = trainer.rollout.generate, trainer.actor.log_probs

    def generate(prompts, **kw):
        out = rollout_generate(prompts, **kw)
        if kw["n"] == 4:  # the training round (validation: greedy and rollout.val_n=2)
            seen["prompts"], seen["batch"] = prompts, out
        return out

    def log_probs(batch, **kw):
        seen["old"] = actor_log_probs(batch, **kw)
        return seen["old"]

    trainer.rollout.generate, trainer.actor.log_probs = generate, log_probs
    trainer.fit()
    # every prompt brought its images; a group's samples share the prompt's one PromptImages
    vision = seen["prompts"]["vision"]
    assert len(vision) == 2 and all(v is not None for v in vision)
    assert all(v is vision[0] for v in seen["batch"]["vision"][:4]) and seen["batch"]["vision"][4] is vision[1]
    step = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert step["step"] == 1
    if schema == "remax":
        assert math.isfinite(step["remax/baseline_score_mean"])
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", *(("actor/kl_loss",) if schema != "remax" else ())):
        assert math.isfinite(step[key]), key
    if schema == "trl":
        assert math.isfinite(step["val/acc_greedy"])
        from reinforge.models.loading import load_causal_lm, load_vlm_processor

        exported = str(tmp_path / "run" / "hf")  # loads back as a VLM with its processor
        assert load_vlm_processor(exported).image_processor is not None
        assert hasattr(load_causal_lm(exported, train=False).model, "visual")
    if not trainer.plan.on_policy:  # old log-probs (with the images) == the rollout's behaviour log-probs
        b, mask = seen["batch"], seen["batch"]["response_mask"].bool()
        old, behaviour = seen["old"]["old_log_probs"][mask], b["rollout_log_probs"][mask]
        assert torch.allclose(old, behaviour, atol=1e-4), (old - behaviour).abs().max()
    else:  # on-policy: the update's own forward is the old policy
        assert abs(step["actor/ppo_kl"]) < 1e-6
    after_tower, after_lm = _params(trainer.actor_model, True), _params(trainer.actor_model, False)
    assert all(torch.equal(tower[k], after_tower[k]) for k in tower), "the vision tower changed"
    assert any(not torch.equal(lm[k], after_lm[k]) for k in lm), "the language model did not train"


@pytest.mark.parametrize("override,key", [
    ({"rollout.backend": "vllm"}, "rollout.backend=vllm"),
    ({"rollout.max_turns": 2}, "rollout.max_turns=2"),
])
def test_vlm_refusals_before_models_load(override, key, vlm_setup, tmp_path, no_model_loads, monkeypatch):
    import reinforge.workers.rollout as rollouts
    from reinforge.trainers.plan import resolve

    monkeypatch.setattr(rollouts, "check_rollout_device", lambda backend, device: None)  # vLLM's GPU check

    model, verl_file, _ = vlm_setup
    cfg = load_config(RLConfig, "grpo", _overrides(model, verl_file, str(tmp_path / "run"), **override))
    with pytest.raises(ConfigError, match=key.replace("[", r"\[")) as err:
        resolve(cfg)
    assert "vision-language" in str(err.value) and "\n" not in str(err.value)


def test_dry_run_reads_image_prompts(vlm_setup, tmp_path, capsys, no_model_loads):
    """`reinforge train --dry-run` reads a VLM's image rows with its processor, loading no model."""
    from reinforge.cli.main import main

    model, verl_file, _ = vlm_setup
    assert main(["train", "--config", "grpo", "--dry-run", *_overrides(model, verl_file, str(tmp_path / "run"))]) == 0
    assert "data.train_files: 8 prompts" in capsys.readouterr().out
