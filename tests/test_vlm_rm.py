"""Reward-model training on image rows with a tiny Qwen2-VL (TRL's vision preference rows: `images`
beside prompt/chosen/rejected; veRL's `<image>` prompts): the VLM backbone with a bias-free
scalar head (models/vlm_critic.VisionValueModel). One step trains the language model and the head
and leaves the frozen tower as it was; a score of a left- or right-padded batch equals each row
alone through transformers' own forward; the export loads back as a reward model and as a critic
with its head; bad inputs are refused before any model loads."""
from __future__ import annotations

import json
import math
import re

import pytest
import torch

from reinforge.config.load import ConfigError, load_config
from reinforge.config.preference import RMConfig
from reinforge.data.io import DataError
from tests.test_vlm_sft_dpo import (BAD_PREFERENCE_CASES, _assert_trained, _params, bad_preference_rows,  # noqa: F401
                                    vlm_data)  # vlm_data: a fixture

pytestmark = pytest.mark.usefixtures("one_thread")


def _rm_cfg(model: str, train: str, run_dir, **extra) -> RMConfig:
    base = {"model.path": model, "data.train_files": f"[{train}]", "data.val_fraction": 0.0, "data.max_length": 64,
            "data.batch_size": 4, "optim.micro_batch_size": 2, "trainer.total_steps": 1, "optim.lr": 1e-2,
            "optim.warmup_steps": 0, "trainer.run_dir": str(run_dir), "trainer.progress": False,
            "trainer.loggers": "[jsonl]", "trainer.val_before_train": False, "trainer.export_hf": False,
            "trainer.save_every": 0}
    base.update(extra)
    return load_config(RMConfig, "rm", [f"{k}={v}" for k, v in base.items()])


@pytest.mark.parametrize("schema", ["trl", "verl"])
def test_rm_step_on_image_rows(schema, vlm_data, tmp_path):
    """One Bradley-Terry step: finite loss, the language model and the head trained, the frozen
    tower unchanged; (trl) the export holds the image processor and loads as a reward model and as
    a critic, both keeping the trained head, with the scores the trainer computes."""
    from reinforge.models.loading import load_critic, load_reward_model, load_vlm_processor
    from reinforge.models.vlm_critic import VisionValueModel
    from reinforge.trainers.preference_common import pair_tensors
    from reinforge.trainers.rm import RMTrainer, sequence_rewards

    extra = {"trainer.export_hf": True} if schema == "trl" else {}
    trainer = RMTrainer(_rm_cfg(vlm_data["model"], vlm_data[f"prefs_{schema}"], tmp_path / "run", **extra))
    assert isinstance(trainer.model, VisionValueModel) and trainer.model.score.bias is None
    assert all(trainer.train[i]["vision"] is not None for i in range(len(trainer.train)))
    tower, lm = _params(trainer.model, True), _params(trainer.model, False)
    trainer.fit()
    step = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    assert step["step"] == 1 and math.isfinite(step["loss"]) and math.isfinite(step["grad_norm"])
    assert step["loss"] > 0 and 0.0 <= step["rewards/accuracies"] <= 1.0
    _assert_trained(tower, lm, trainer.model)
    assert not torch.equal(lm["score.weight"], trainer.model.score.weight)
    if schema != "trl":
        return
    hf = str(tmp_path / "run" / "hf")
    assert load_vlm_processor(hf).image_processor is not None
    rm, critic = load_reward_model(hf, dtype="float32"), load_critic(hf, dtype="float32")
    assert torch.equal(rm.score.weight, trainer.model.score.weight) and rm.score.bias is None
    assert torch.equal(critic.score.weight, trainer.model.score.weight)  # a critic from the RM keeps its head
    assert rm.config.reinforge_score_eos is False
    items = [trainer.train[i] for i in range(2)]
    batch = pair_tensors(items, trainer.pad_id, "cpu")
    trainer.model.eval()
    with torch.no_grad():
        want = sequence_rewards(trainer.model, batch, score_eos=False)
        torch.testing.assert_close(sequence_rewards(rm, batch, score_eos=False), want, atol=1e-5, rtol=0)


def _own_score(model, ids: list[int], vision, skip_last: int) -> float:
    """A row's score from transformers' own forward of the unpadded sequence (pixel_values, its
    own get_rope_index positions) and the head at its scored token."""
    one = torch.tensor([ids])
    hidden = model.model(input_ids=one, pixel_values=vision.pixel_values, image_grid_thw=vision.image_grid_thw,
                         mm_token_type_ids=(one == model.config.image_token_id).long()).last_hidden_state
    return float(model.score(hidden[0, len(ids) - 1 - skip_last]))


@pytest.mark.parametrize("side", ["left", "right"])
def test_rm_score_of_a_padded_batch_equals_each_row_alone(side, vlm_data):
    """last_token_scores of image rows of different lengths, padded on either side, equals each
    row's score alone through the model's own forward (1e-5, fp32, a head re-drawn at std 1 so
    scores are O(1)); a pair's chosen and rejected rows share one encoding."""
    from reinforge.data.preference import PreferenceDataset
    from reinforge.models.loading import load_reward_model, load_vlm_processor
    from reinforge.models.padding import pad
    from reinforge.models.reward_head import last_token_scores
    from reinforge.models.vlm_forward import EncoderCounter

    model = load_reward_model(vlm_data["model"], dtype="float32", train=True).eval()
    torch.nn.init.normal_(model.score.weight, std=1.0)
    proc = load_vlm_processor(vlm_data["model"])
    data = PreferenceDataset(vlm_data["prefs_trl"], proc, max_length=64)
    items = [data[i] for i in range(3)]
    rows = [(it["prompt_ids"] + it[key], it["vision"]) for key in ("chosen_ids", "rejected_ids") for it in items]
    rows[1] = (rows[1][0] + [9, 10, 11], rows[1][1])  # lengths differ: real padding in the batch
    ids, mask = pad([r[0] for r in rows], proc.tokenizer.pad_token_id, side=side)
    assert len({len(r[0]) for r in rows}) > 1
    counter = EncoderCounter(model)
    with torch.no_grad():
        try:
            got = last_token_scores(model, ids, mask, skip_last=1, vision=[r[1] for r in rows])  # (6,)
        finally:
            counter.close()
        own = torch.tensor([_own_score(model, r[0], r[1], 1) for r in rows])
    assert counter.calls == 1 and counter.images == 3  # one encoding per pair
    assert own.abs().max() > 0.1
    torch.testing.assert_close(got, own, atol=1e-5, rtol=0)


@pytest.mark.parametrize("case,message", BAD_PREFERENCE_CASES)
def test_rm_refuses_bad_image_rows_before_a_model_loads(case, message, vlm_data, tmp_path, tiny_model_dir,
                                                        no_model_loads):
    from reinforge.trainers.rm import RMTrainer

    model, train = bad_preference_rows(case, vlm_data, tmp_path, tiny_model_dir)
    with pytest.raises((DataError, ConfigError), match=re.escape(message)) as err:
        RMTrainer(_rm_cfg(model, train, tmp_path / "run"))
    assert "\n" not in str(err.value)


def test_rm_dry_run_reads_image_rows(vlm_data, tmp_path, capsys, no_model_loads):
    from reinforge.cli.main import main

    args = [f"model.path={vlm_data['model']}", f"data.train_files=[{vlm_data['prefs_trl']}]", "data.max_length=64",
            "data.batch_size=2", f"trainer.run_dir={tmp_path / 'run'}"]
    assert main(["rm", "--dry-run", *args]) == 0
    assert re.search(r"data.train_files: \d+ training pairs", capsys.readouterr().out)


def test_a_vision_language_reward_model_is_refused_in_rl(vlm_data, tiny_model_dir, arith_data, tmp_path,
                                                         no_model_loads):
    """The RL reward scorer reads decoded text: a VLM reward model would score without the images."""
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.plan import resolve
    from tests.conftest import rl_overrides

    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path / "run"), **{
        "reward.reward_model_path": vlm_data["model"]}))
    with pytest.raises(ConfigError, match=r"reward.reward_model_path=.*is a vision-language reward model") as err:
        resolve(cfg)
    assert "\n" not in str(err.value)
