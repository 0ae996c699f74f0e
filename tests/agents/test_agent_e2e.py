"""A tiny GRPO run with a tool through the trainer (a model taught the call format first, so
its episodes call the tool), and a resumed run that ends bit-identical to an uninterrupted one."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from reinforge.config.load import load_config
from reinforge.config.schema import RLConfig
from reinforge.trainers.rl import RLTrainer
from tests.agents.tool_model import NUMBERS, train_tool_model
from tests.conftest import fit_until_crash

pytestmark = pytest.mark.usefixtures("one_thread")
FNS = Path(__file__).with_name("agent_fns.py")


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory) -> str:
    """The tiny Qwen2 taught to call `rev` (tests/agents/tool_model.py)."""
    return train_tool_model(str(tmp_path_factory.mktemp("tool_model")), num_heads=4, num_kv_heads=2)


def _data(tmp_path) -> str:
    path = tmp_path / "rev.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{x}:", "ground_truth": x[::-1]}) + "\n" for x in NUMBERS))
    return str(path)


def _cfg(model, data, run_dir, **extra) -> RLConfig:
    base = {"model.path": model, "data.train_files": f"[{data}]", "data.max_prompt_length": 4,
            "rollout.max_response_length": 32, "data.train_batch_size": 2, "rollout.n": 4, "trainer.total_steps": 2,
            "trainer.run_dir": run_dir, "reward.functions": f"[{{name: '{FNS}:reversed_answer'}}]",
            "trainer.progress": False, "trainer.loggers": "[jsonl]", "trainer.report": False, "actor.lr": 1e-3,
            "actor.micro_batch_size": 8, "rollout.max_turns": 3, "rollout.tools": f"[python:{FNS}:REV]",
            "trainer.export_hf": False, "trainer.log_samples_every": 1, **extra}
    return load_config(RLConfig, "grpo", [f"{k}={v}" for k, v in base.items()])


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_grpo_with_a_tool_then_resume(tool_model, tmp_path):
    data = _data(tmp_path)
    extra = {"trainer.save_every": 1, "trainer.keep_last": 2}
    RLTrainer(_cfg(tool_model, data, str(tmp_path / "a"), **extra)).fit()
    rows = [r for r in _metrics(tmp_path / "a") if r["step"] >= 1]
    assert len(rows) == 2
    assert rows[0]["agent/tool_calls_mean"] > 0.5 and rows[0]["agent/turns_mean"] > 1.5
    assert rows[0]["agent/tool_errors"] == 0 and 0 < rows[0]["agent/tool_latency_s"] < 1.0
    samples = [json.loads(x) for x in (tmp_path / "a" / "samples" / "train_step_1.jsonl").read_text().splitlines()]
    called = [s for s in samples if s["tool_calls"]]
    assert called and all("<r>" in s["response"] and s["turns"] >= 2 for s in called)
    # the reward read each episode's last turn (the trajectory): the answer after the tool's result
    for s in samples:
        last = s["response"].rsplit("</r>", 1)[-1]
        assert s["rewards"]["reversed_answer"] == float(last.strip() == s["ground_truth"])

    b = RLTrainer(_cfg(tool_model, data, str(tmp_path / "b"), **extra))
    fit_until_crash(b, 2)
    RLTrainer(_cfg(tool_model, data, str(tmp_path / "b"), **extra)).fit(resume=True)
    wa = load_file(str(tmp_path / "a" / "checkpoints" / "step_2" / "actor.safetensors"))
    wb = load_file(str(tmp_path / "b" / "checkpoints" / "step_2" / "actor.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa), "the resumed agent run differs from the uninterrupted one"
    assert _metrics(tmp_path / "b")[-1]["agent/turns_mean"] == rows[1]["agent/turns_mean"]
