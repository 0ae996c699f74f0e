"""Multi-turn agents on the real engine: the built-in agent loop (rollout.max_turns > 1) and an
OpenAI-client agent through the model gateway (rollout.agent), both generating with vLLM.

The model is the tiny Qwen2 taught `12:` -> `<rev>12</rev><r>21</r>21<eos>` (as
tests/agents/test_agent_e2e.py's, with 2 heads of 32: vLLM's CPU attention takes head sizes of
32 and up), so greedy episodes call the tool, and the tag parser's stop string `</rev>` ends
their first turn inside vLLM."""
from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="the real-vLLM tests run in .venv-vllm: make test-vllm")
pytestmark = pytest.mark.vllm

from tests.agents.tool_model import NUMBERS, train_tool_model  # noqa: E402
from tests.vllm_real.conftest import ENGINE_KW  # noqa: E402
from tests.vllm_real.test_train import VLLM, _steps  # noqa: E402

TESTS = Path(__file__).parents[1]
AGENT = f"{TESTS / 'gateway' / 'gateway_agents.py'}:rev_tool"


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory) -> str:
    """The tiny Qwen2 taught to call `rev` (tests/agents/tool_model.py), 2 heads of 32: vLLM's CPU attention takes head sizes of 32 and up."""
    return train_tool_model(str(tmp_path_factory.mktemp("vllm_tool_model")), num_heads=2, num_kv_heads=1)


@pytest.fixture(scope="module")
def rev_data(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("rev") / "rev.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{x}:", "ground_truth": x[::-1]}) + "\n" for x in NUMBERS))
    return str(path)


def test_agent_loop_and_openai_agent_on_vllm_equal_the_lean_loop(tool_model):
    """Greedy `rev` episodes three ways: the agent loop on the lean engine, the agent loop on
    vLLM, and the OpenAI tools= agent through the gateway on vLLM: the same ids and masks, and
    log-probs within 1e-4 (fp32)."""
    from reinforge.agents.loop import AgentRollout
    from reinforge.agents.parsers import get_parser
    from reinforge.gateway.rollout import GatewayRollout
    from reinforge.models.loading import load_causal_lm, load_tokenizer
    from reinforge.trainers.validation import prompts_batch
    from reinforge.workers.rollout.lean import LeanRollout
    from reinforge.workers.rollout.vllm import VLLMRollout
    from tests.agents.agent_fns import REV
    from tests.gateway.gateway_agents import rev_tool

    tok = load_tokenizer(tool_model)
    model = load_causal_lm(tool_model, dtype="float32", device="cpu").eval()
    items = [{"prompt_ids": tok(f"{x}:", add_special_tokens=False)["input_ids"], "prompt_text": f"{x}:",
              "ground_truth": x[::-1], "data_source": "rev", "extra": {}, "prompt_raw": f"{x}:"} for x in NUMBERS[:6]]
    prompts = prompts_batch(items, 0)
    loop = dict(max_turns=3, parser=get_parser("tag"), tools={"rev": REV})
    want = AgentRollout(LeanRollout(model, tok, max_prompt_length=4, max_response_length=32), tok,
                        **loop).generate(prompts, n=1, greedy=True)
    assert sum(t["tool_calls"] for t in want["trajectory"]) >= 3  # the episodes do call the tool
    gc.collect()  # one engine at a time in the process (conftest.py)
    engine = VLLMRollout(model, tok, max_prompt_length=4, max_response_length=32, model_path=tool_model, seed=1,
                         **ENGINE_KW)
    try:
        got_loop = AgentRollout(engine, tok, **loop).generate(prompts, n=1, greedy=True)
        gw = GatewayRollout(engine, tok, rev_tool, parser=get_parser("tag"))
        try:
            got_gw = gw.generate(prompts, n=1, greedy=True)
        finally:
            gw.close()
    finally:
        engine.close()
        gc.collect()
    for got in (got_loop, got_gw):
        for key in ("prompts", "responses", "response_mask", "attention_mask"):
            assert torch.equal(got[key], want[key]), key
        torch.testing.assert_close(got["rollout_log_probs"], want["rollout_log_probs"], atol=1e-4, rtol=0)
        assert [t["tool_calls"] for t in got["trajectory"]] == [t["tool_calls"] for t in want["trajectory"]]


@pytest.mark.parametrize("how", ["agent", "loop", "loop_ray"])
def test_grpo_with_agents_on_vllm(how, tool_model, rev_data, tmp_path, request):
    """Two GRPO steps through the CLI on rollout.backend=vllm, the `rev` task played by an
    OpenAI-client agent (rollout.agent) or by the agent loop (rollout.max_turns=3; loop_ray: in
    a Ray rank with its engine): episodes call the tool, and after the first update the
    engine's log-probs are still the trainer's."""
    from reinforge.cli.main import main
    from tests.agents.test_agent_e2e import FNS

    over = {"model.path": tool_model, "data.train_files": f"[{rev_data}]", "data.val_files": f"[{rev_data}]",
            "data.max_prompt_length": 4, "rollout.max_response_length": 32, "data.train_batch_size": 2,
            "rollout.n": 4, "trainer.total_steps": 2, "trainer.run_dir": str(tmp_path), "trainer.progress": False,
            "trainer.loggers": "[jsonl]", "trainer.report": False, "actor.lr": 1e-3, "actor.micro_batch_size": 8,
            "trainer.export_hf": False, "trainer.val_every": 100, "trainer.val_before_train": False, **VLLM}
    if how == "agent":
        over |= {"rollout.agent": AGENT, "reward.functions": "[]"}
    else:
        over |= {"rollout.max_turns": 3, "rollout.tools": f"[{FNS}:REV]",
                 "reward.functions": f"[{{name: '{FNS}:reversed_answer'}}]"}
    if how == "loop_ray":
        pytest.importorskip("ray")
        request.getfixturevalue("ray_cluster")
        over |= {"trainer.backend": "ray", "trainer.devices_per_node": 1}
    gc.collect()  # one engine at a time in the process
    assert main(["train", "--config", "grpo", *[f"{k}={v}" for k, v in over.items()]]) == 0
    gc.collect()
    steps = _steps(tmp_path)
    assert len(steps) == 2
    for s in steps:
        assert s["rollout_corr/logprob_gap_max"] < 1e-4, s["rollout_corr/logprob_gap_max"]
        assert s["agent/tool_calls_mean"] > 0, s  # the episodes call the tool
        if how == "agent":
            assert s["agent/gateway/runs"] == 8.0 and s["agent/gateway/dropped"] == 0.0
    print(how, {k: steps[-1][k] for k in ("rollout_corr/logprob_gap_max", "agent/tool_calls_mean",
                                            "critic/score/mean", "timing_s/gen", "timing_s/step") if k in steps[-1]})
