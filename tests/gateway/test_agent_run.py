"""rollout.agent through the trainer: config checks before any model loads, a GRPO run with an
OpenAI-client agent, and the built-in agent loop's episodes reproduced token for token by the
same task written as an OpenAI tools= agent."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from reinforge.config.load import ConfigError, load_config
from reinforge.config.schema import RLConfig
from reinforge.trainers.rl import RLTrainer
from tests.agents.test_agent_e2e import NUMBERS, tool_model  # noqa: F401 - the fixture: a model that calls `rev`
from tests.conftest import rl_overrides

pytestmark = pytest.mark.usefixtures("one_thread")
AGENTS = Path(__file__).with_name("gateway_agents.py")


def _cfg(tiny_model_dir, arith_data, run_dir, **extra) -> RLConfig:
    over = rl_overrides(tiny_model_dir, arith_data, run_dir, **{"rollout.agent": f"{AGENTS}:digits",
                                                              "reward.functions": "[]", **extra})
    return load_config(RLConfig, "grpo", over)


@pytest.mark.parametrize("extra,match", [
    ({"rollout.agent": f"{AGENTS}:nope"}, "rollout.agent"),
    ({"rollout.agent": "missing_file.py:run"}, "rollout.agent"),
    ({"rollout.staleness": 1, "rollout.schedule": "deterministic"}, "rollout.schedule=timing"),
    ({"rollout.staleness": 1, "rollout.partial": True}, "rollout.partial=false"),
    ({"trainer.backend": "ray", "rollout.staleness": 1, "rollout.partial": True}, "rollout.partial=false"),
    ({"rollout.max_turns": 3, "rollout.tools": "[calculator]"}, "its own loop"),
    ({"rollout.agent_history": "merge"}, "rollout.agent_history"),
    ({"rollout.agent_timeout_s": 0}, "agent_timeout_s"),
])
def test_config_errors_before_any_model_loads(tiny_model_dir, arith_data, tmp_path, no_model_loads, extra, match):
    with pytest.raises(ConfigError, match=match):
        RLTrainer(_cfg(tiny_model_dir, arith_data, str(tmp_path), **extra))


@pytest.mark.slow
def test_grpo_with_an_openai_client_agent(tiny_model_dir, arith_data, tmp_path):
    trainer = RLTrainer(_cfg(tiny_model_dir, arith_data, str(tmp_path), **{"trainer.val_every": 2}))
    trainer.fit()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert len(steps) == 2
    for r in steps:
        assert r["agent/gateway/runs"] == 16.0 and r["agent/gateway/dropped"] == 0.0
        assert r["agent/gateway/sequences"] == 16.0 and r["agent/turns_mean"] == 1.0
        assert 0.0 <= r["critic/score/mean"] <= 1.0 and "agent/metrics/answer_chars" in r
    assert any("val/acc_greedy" in r for r in rows)


@pytest.mark.slow
def test_openai_tools_agent_equals_the_agent_loop(tool_model, tmp_path):  # noqa: F811
    """The `rev` task two ways, greedy: the built-in loop (rollout.tools, tag parser) and an
    OpenAI tools= agent through the gateway give the same token ids, masks and log-probs."""
    from reinforge.agents.loop import AgentRollout
    from reinforge.agents.parsers import get_parser
    from reinforge.gateway.rollout import GatewayRollout
    from reinforge.models.loading import load_causal_lm, load_tokenizer
    from reinforge.trainers.validation import prompts_batch
    from reinforge.workers.rollout.lean import LeanRollout
    from tests.agents.agent_fns import REV
    from gateway_agents import rev_tool

    tok = load_tokenizer(tool_model)
    model = load_causal_lm(tool_model, dtype="float32", device="cpu").eval()
    engine = LeanRollout(model, tok, max_prompt_length=4, max_response_length=32)
    items = [{"prompt_ids": tok(f"{x}:", add_special_tokens=False)["input_ids"], "prompt_text": f"{x}:",
              "ground_truth": x[::-1], "data_source": "rev", "extra": {}, "prompt_raw": f"{x}:"} for x in NUMBERS[:6]]
    prompts = prompts_batch(items, 0)
    loop = AgentRollout(engine, tok, max_turns=3, parser=get_parser("tag"), tools={"rev": REV})
    want = loop.generate(prompts, n=1, greedy=True)
    gw = GatewayRollout(engine, tok, rev_tool, parser=get_parser("tag"))
    try:
        got = gw.generate(prompts, n=1, greedy=True)
    finally:
        gw.close()
    assert len(got) == 6
    assert sum(t["tool_calls"] for t in want["trajectory"]) >= 3  # the episodes do call the tool
    for key in ("prompts", "responses", "response_mask", "attention_mask"):
        assert torch.equal(got[key], want[key]), key
    torch.testing.assert_close(got["rollout_log_probs"], want["rollout_log_probs"], atol=1e-5, rtol=1e-5)
    assert [t["tool_calls"] for t in got["trajectory"]] == [t["tool_calls"] for t in want["trajectory"]]


@pytest.mark.slow
def test_resume_is_exact_with_one_agent_at_a_time(tiny_model_dir, arith_data, tmp_path):
    """kill -9 style resume: a run crashed at step 2 and resumed ends with the uninterrupted
    run's weights (concurrency 1: the calls reach the engine in a fixed order)."""
    from safetensors.torch import load_file

    from tests.conftest import fit_until_crash

    extra = {"trainer.save_every": 1, "trainer.keep_last": 2, "rollout.agent_concurrency": 1,
             "trainer.export_hf": False, "data.train_batch_size": 2, "rollout.n": 2, "trainer.val_before_train": False,
             "trainer.val_every": 100}
    RLTrainer(_cfg(tiny_model_dir, arith_data, str(tmp_path / "a"), **extra)).fit()
    b = RLTrainer(_cfg(tiny_model_dir, arith_data, str(tmp_path / "b"), **extra))
    fit_until_crash(b, 2)
    RLTrainer(_cfg(tiny_model_dir, arith_data, str(tmp_path / "b"), **extra)).fit(resume=True)
    wa = load_file(str(tmp_path / "a" / "checkpoints" / "step_2" / "actor.safetensors"))
    wb = load_file(str(tmp_path / "b" / "checkpoints" / "step_2" / "actor.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa), "the resumed run differs from the uninterrupted one"


@pytest.mark.slow
def test_dynamic_sampling_with_dropped_runs(tiny_model_dir, arith_data, tmp_path):
    """Runs that raise are void rows (groups of their own): dynamic sampling leaves them out."""
    extra = {"rollout.agent": f"{AGENTS}:raises", "algorithm.dynamic_sampling": True, "algorithm.max_gen_rounds": 2,
             "trainer.total_steps": 1}
    RLTrainer(_cfg(tiny_model_dir, arith_data, str(tmp_path), **extra)).fit()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if r.get("step") == 1)
    assert 1 <= step["dynamic_sampling/gen_rounds"] <= 2  # the step ran or was skipped; it did not fail
