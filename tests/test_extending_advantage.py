"""docs/extending.md ("Adding an advantage estimator")'s worked example runs as written: the python block registers an
advantage estimator with one hyper-parameter (grpo_clipped, adv_clip) and a config section that
holds it; here it is checked by hand on two groups of two, through the config's checks, and in
one RL step on the tiny model."""
from __future__ import annotations

import json
import math
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from reinforge.algos.advantages import (ADVANTAGE_ESTIMATORS, NEEDS_GROUPS, AdvantageInput, compute_advantages,
                                        estimator_kwargs)
from reinforge.config.load import ConfigError, load_config
from reinforge.config.validate import validate
from reinforge.trainers import stages
from reinforge.trainers.rl import RLTrainer
from tests.conftest import rl_overrides

pytestmark = pytest.mark.usefixtures("one_thread")
DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


@pytest.fixture
def example(monkeypatch):
    """The namespace of the document's python block, run as a module of its own (its dataclasses
    look their module up), its estimator registered for this test only."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Adding an advantage estimator"):text.index("## Adding a rollout backend")]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    module = types.ModuleType("extending_advantage_example")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    try:
        # dont_inherit: the block runs without this file's `from __future__ import annotations`
        exec(compile(block, str(DOC), "exec", dont_inherit=True), module.__dict__)  # noqa: S102
        yield module.__dict__
    finally:
        if "grpo_clipped" in ADVANTAGE_ESTIMATORS:
            ADVANTAGE_ESTIMATORS.unregister("grpo_clipped")


def _cfg(example, tmp_path, tiny_model_dir, arith_data, **extra):
    over = rl_overrides(tiny_model_dir, arith_data, str(tmp_path / "run"),
                        **{"algorithm.adv_estimator": "grpo_clipped", **extra})
    return load_config(example["ClippedRLConfig"], "grpo", over)


def test_hand_computed_two_groups_of_two(example):
    """Scores 1, 0 (mean 0.5) and 3, 0 (mean 1.5): centred +-0.5 and +-1.5; clipped at 1."""
    assert example["cfg"].algorithm.adv_clip == 0.5  # the block's own config
    rewards = torch.zeros(4, 3)
    rewards[0, 1], rewards[2, 2] = 1.0, 3.0  # outcome on the last valid token
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 0, 0]], dtype=torch.float32)
    inp = AdvantageInput(rewards, mask, group_ids=torch.tensor([7, 7, 3, 3]))
    adv, ret = compute_advantages("grpo_clipped", inp, adv_clip=1.0)
    want = torch.tensor([[0.5, 0.5, 0.0], [-0.5, -0.5, -0.5], [1.0, 1.0, 1.0], [-1.0, 0.0, 0.0]])
    assert torch.equal(adv, want) and torch.equal(ret, want)
    adv, _ = compute_advantages("grpo_clipped", inp, adv_clip=0.25)
    assert torch.equal(adv, want.clamp(-0.25, 0.25))


def test_config_key_range_name_and_traits(example, tmp_path, tiny_model_dir, arith_data):
    cfg = validate(_cfg(example, tmp_path, tiny_model_dir, arith_data, **{"algorithm.adv_clip": 0.3}))
    assert estimator_kwargs("grpo_clipped", cfg.algorithm) == {"adv_clip": 0.3}
    assert estimator_kwargs("grpo", cfg.algorithm) == {}  # the built-ins read AdvantageInput's fields
    assert "grpo_clipped" in NEEDS_GROUPS  # registered after the module's sets were made
    with pytest.raises(ConfigError, match=r"^algorithm.adv_clip=0.0 is out of range; valid range: \(0, inf\)$"):
        validate(_cfg(example, tmp_path, tiny_model_dir, arith_data, **{"algorithm.adv_clip": 0}))
    with pytest.raises(ConfigError, match="did you mean 'algorithm.adv_estimator=grpo_clipped'"):
        validate(_cfg(example, tmp_path, tiny_model_dir, arith_data, **{"algorithm.adv_estimator": "grpo_clip"}))
    with pytest.raises(ConfigError, match=r"grpo_clipped' compares samples within a group: rollout.n=1"):
        validate(_cfg(example, tmp_path, tiny_model_dir, arith_data, **{"rollout.n": 1}))


def test_one_rl_step_uses_the_estimator(example, tmp_path, tiny_model_dir, arith_data, monkeypatch):
    """The step's advantages are the formula on the batch's scores (clip 0.1, which binds), and the actor moves."""
    seen = []
    real = stages.compute_advantages

    def record(name, inp, **hyper):
        out = real(name, inp, **hyper)
        seen.append((name, hyper, inp, out[0]))
        return out

    monkeypatch.setattr(stages, "compute_advantages", record)
    cfg = _cfg(example, tmp_path, tiny_model_dir, arith_data, **{
        "algorithm.adv_clip": 0.1, "trainer.total_steps": 1, "trainer.val_before_train": False,
        "data.val_files": "[]", "trainer.export_hf": False})
    trainer = RLTrainer(cfg)
    before = [p.detach().clone() for p in trainer.actor_model.parameters()]
    trainer.fit()
    after = list(trainer.actor_model.parameters())
    trainer.close()
    (name, hyper, inp, adv), = seen
    assert name == "grpo_clipped" and hyper == {"adv_clip": 0.1}
    scores = (inp.token_level_rewards * inp.response_mask).sum(-1)  # (B,)
    same = inp.group_ids[:, None] == inp.group_ids[None, :]  # (B, B)
    mean = (same * scores[None, :]).sum(-1) / same.sum(-1)
    assert (scores - mean).abs().max() > 0.1  # the clip binds on this batch
    want = (scores - mean).clamp(-0.1, 0.1)[:, None] * inp.response_mask
    torch.testing.assert_close(adv, want, rtol=0, atol=1e-6)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if r["step"] == 1][-1]
    assert math.isfinite(step["actor/pg_loss"])
    assert any(not torch.equal(b, a.detach()) for b, a in zip(before, after))
