"""docs/extending.md's worked example runs as written: the python block registers a
reward style (OpenRLHF's), and a function in it scores one RL step on the tiny model."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from reinforge.config.load import load_config
from reinforge.config.schema import RLConfig
from reinforge.rewards.styles import STYLES, calling, style_choices
from reinforge.trainers.rl import RLTrainer
from tests.conftest import rl_overrides

pytestmark = pytest.mark.usefixtures("one_thread")
DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


@pytest.fixture
def example():
    """The namespace of the document's python block, its style registered for this test only."""
    text = DOC.read_text()
    section = text[text.index("## Adding a reward style"):text.index("## Naming your own code")]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    namespace: dict = {"__name__": "extending_rewards_example"}
    exec(compile(block, str(DOC), "exec"), namespace)  # noqa: S102 - the documented example itself
    try:
        yield namespace
    finally:
        STYLES.pop("openrlhf", None)


def test_registered_style_is_detected_and_trains_one_step(example, tiny_model_dir, arith_data, tmp_path):
    fn = example["reward_func"]
    c = calling(fn)
    assert (c.style, c.batched, c.signature) == ("openrlhf", True, "reward_func(queries, prompts, labels) -> list")
    assert "openrlhf" in style_choices()
    run = tmp_path / "run"
    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(run), **{
        "trainer.total_steps": 1, "trainer.val_before_train": False, "data.val_files": "[]",
        "trainer.export_hf": False}))
    trainer = RLTrainer(cfg, reward_funcs=[fn])
    trainer.fit()
    trainer.close()
    row = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert row["step"] == 1 and 0.0 <= row["reward/reward_func/mean"] <= 1.0
    assert row["reward/errors"] == 0 and row["reward/acc"] == row["reward/reward_func/mean"]
