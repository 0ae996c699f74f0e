"""docs/extending.md's worked examples, as a user would run them: each docs block is
written to a file in the working directory, named with the one user-code syntax
(`my_tools.py:word_count`, `my_envs.py:SecondTry`), played for one episode through the agent
loop (a scripted policy, so the episode is known) and trained for one RL step on the tiny model."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from reinforge.agents.loop import make_agent_rollout
from reinforge.config.load import load_config
from reinforge.config.schema import RLConfig, RolloutConfig
from reinforge.tasks import build_char_tokenizer
from reinforge.trainers.validation import prompts_batch
from tests.agents.test_loop import Scripted
from tests.conftest import rl_overrides

pytestmark = pytest.mark.usefixtures("one_thread")
DOC = Path(__file__).resolve().parents[1] / "docs" / "extending.md"


def write_example(folder: Path, name: str) -> None:
    """The docs block whose first line names the file `name`, written to folder/name."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    (folder / name).write_text(next(b for b in blocks if b.startswith(f"# {name}:")))


def one_episode(r: RolloutConfig, script, ground_truth: str) -> dict:
    """The trajectory (and response text) of one episode of prompt 'x=' under a scripted policy:
    script(context text) -> (the turn's text, whether it ends with EOS)."""
    tok = build_char_tokenizer()

    def turn(ctx: str) -> list[int]:
        text, eos = script(ctx)
        return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] * eos

    loop = make_agent_rollout(r, Scripted(tok, turn), tok)
    prompts = prompts_batch([{"prompt_ids": tok("x=")["input_ids"], "prompt_text": "x=", "ground_truth": ground_truth,
                              "extra": {}}], 0)
    out = loop.generate(prompts, n=1)
    return out["trajectory"][0] | {"text": tok.decode(out["responses"][0][out["attention_mask"][0, 8:].bool()])}


def one_rl_step(model: str, data: dict, run_dir: Path, **overrides) -> dict:
    """Train one GRPO step with a two-turn agent loop; the step's metrics row."""
    from reinforge.trainers.rl import RLTrainer

    extra = {"rollout.max_turns": 2, "rollout.max_response_length": 12, "trainer.total_steps": 1,
             "trainer.val_before_train": False, "trainer.export_hf": False, **overrides}
    RLTrainer(load_config(RLConfig, "grpo", rl_overrides(model, data, str(run_dir), **extra))).fit()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in rows if r["step"] == 1)


def test_adding_a_tool(tmp_path, monkeypatch, tiny_model_dir, arith_data):
    monkeypatch.chdir(tmp_path)
    write_example(tmp_path, "my_tools.py")
    r = RolloutConfig(max_turns=2, tools=["my_tools.py:word_count"])
    # The policy calls the tool, reads its answer, and answers.
    t = one_episode(r, lambda ctx: ("3", True) if "<r>" in ctx else ("<word_count>a b c</word_count>", False), "3")
    assert (t["turns"], t["tool_calls"], t["tool_errors"]) == (2, 1, 0)
    assert [m["content"] for m in t["messages"]][1:] == ["3", "3"]
    assert t["text"] == "<word_count>a b c</word_count><r>3</r>3<eos>"  # call, observation, answer
    row = one_rl_step(tiny_model_dir, arith_data, tmp_path / "run", **{"rollout.tools": "[my_tools.py:word_count]"})
    assert "agent/tool_calls_mean" in row and math.isfinite(row["actor/pg_loss"])


def test_adding_an_environment(tmp_path, monkeypatch, tiny_model_dir, arith_data):
    monkeypatch.chdir(tmp_path)
    write_example(tmp_path, "my_envs.py")
    r = RolloutConfig(max_turns=2, env="my_envs.py:SecondTry")
    # A wrong answer, the environment's hint, a right answer: the second turn's reward is 1.
    t = one_episode(r, lambda ctx: ("7", True) if "<r>no</r>" in ctx else ("5", True), "7")
    assert (t["turns"], t["turn_rewards"]) == (2, [0.0, 1.0])
    assert t["text"] == "5<eos><r>no</r>7<eos>"
    row = one_rl_step(tiny_model_dir, arith_data, tmp_path / "run",
                      **{"rollout.env": "my_envs.py:SecondTry", "reward.functions": "[]"})
    assert row["agent/turns_mean"] >= 1 and math.isfinite(row["actor/pg_loss"])
