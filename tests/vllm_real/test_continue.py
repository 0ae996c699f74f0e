"""continue_ids on the real engine (the agent loop's and the gateway's contract, rollout/base.py):
greedy turns equal the lean engine's token for token, with per-row budgets and stop strings;
sampled turns are seeded from torch's RNG and scored as the trainer scores them; and the model
gateway served by vLLM answers the real openai client with ids and log-probs the trainer's
recomputation matches."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="the real-vLLM tests run in .venv-vllm: make test-vllm")
pytestmark = pytest.mark.vllm

from tests.vllm_real.conftest import P, T, perturb, use  # noqa: E402

CONTEXTS = [list(range(4, 42)), [9, 10, 11], list(range(20, 44))]
"""Token contexts of 38, 3 and 24 tokens (the engine's window is P + T = 48)."""


@pytest.fixture(scope="module")
def pair(engine, vllm_model_dir):
    """(the vLLM engine, a lean engine) on the same perturbed fp32 weights."""
    from reinforge.models.loading import load_causal_lm
    from reinforge.workers.rollout.lean import LeanRollout

    model = load_causal_lm(vllm_model_dir, dtype="float32")
    perturb(model, seed=3)
    r = use(engine, model)
    return r, LeanRollout(model, r.tok, max_prompt_length=P, max_response_length=T)


def _stops(tok, budgets, strings):
    from reinforge.agents.loop import StopScanner, TurnStops

    return TurnStops(list(budgets), [StopScanner(tok, list(s)) for s in strings])


def _turn(ids: torch.Tensor, eos_ids) -> list[int]:
    """A row's turn as the callers cut it: up to its first EOS (included)."""
    row = ids.tolist()
    return row[:next((k + 1 for k, t in enumerate(row) if t in eos_ids), len(row))]


def test_vllm_reports_that_it_continues(pair):
    from reinforge.workers.rollout import rollout_capabilities

    assert pair[0].capabilities.continues and rollout_capabilities("vllm").continues


def test_greedy_continuation_equals_the_lean_engine(pair):
    """Per-row budgets (8, 3, 5), then a stop string taken from row 0's own continuation: the
    same ids, padded the same way, and log-probs within 1e-4 (fp32)."""
    vllm, lean = pair
    greedy = dict(greedy=True, sampling=(1.0, 0, 1.0))
    stops = _stops(vllm.tok, [8, 3, 5], [[], [], []])
    got, got_lp = vllm.continue_ids(CONTEXTS, T, stop=stops, **greedy)
    want, want_lp = lean.continue_ids(CONTEXTS, T, stop=stops, **greedy)
    assert got.shape == want.shape == (3, T)
    assert torch.equal(got, want), (got, want)
    torch.testing.assert_close(got_lp, want_lp, atol=1e-4, rtol=0)
    for row, budget in enumerate([8, 3, 5]):  # nothing past a row's budget
        assert (got[row, budget:] == vllm.tok.pad_token_id).all() and (got_lp[row, budget:] == 0).all()
    # a stop string the greedy turn of row 0 meets at its 3rd token: both engines end the row there
    first = _turn(got[0], vllm.eos_ids)
    assert len(first) >= 4 and first[2] not in vllm.eos_ids
    stop_text = vllm.tok.decode([first[2]], skip_special_tokens=False)
    stops = _stops(vllm.tok, [8, 8, 8], [[stop_text], [], []])
    got2, got2_lp = vllm.continue_ids(CONTEXTS, T, stop=stops, **greedy)
    want2, want2_lp = lean.continue_ids(CONTEXTS, T, stop=stops, **greedy)
    cut = stops.scanners[0].first_cut(first)
    assert cut <= 3 and got2[0, :cut].tolist() == first[:cut]
    assert (got2[0, cut:] == vllm.tok.pad_token_id).all()
    assert torch.equal(got2, want2)
    torch.testing.assert_close(got2_lp, want2_lp, atol=1e-4, rtol=0)


def test_sampled_turns_are_seeded_and_scored_like_the_trainer(pair):
    """temperature 0.8, top-k 5, top-p 0.9: the same torch seed gives the same rows, and each
    row's log-probs are the trainer's recomputation under that distribution."""
    from tests.gateway.gateway_helpers import model_log_probs

    vllm, lean = pair
    sampling = (0.8, 5, 0.9)
    torch.manual_seed(7)
    ids, lp = vllm.continue_ids(CONTEXTS, T, greedy=False, sampling=sampling)
    torch.manual_seed(7)
    again, _ = vllm.continue_ids(CONTEXTS, T, greedy=False, sampling=sampling)
    assert torch.equal(ids, again)
    for row, ctx in enumerate(CONTEXTS):
        turn = _turn(ids[row], vllm.eos_ids)
        want = model_log_probs(lean.model, ctx, turn, sampling)
        torch.testing.assert_close(lp[row, :len(turn)], want, atol=1e-4, rtol=1e-4)
    assert len({tuple(_turn(r, vllm.eos_ids)) for r in ids}) == 3


def test_a_context_beyond_the_engine_window_is_refused(pair):
    with pytest.raises(ValueError, match="window of 48"):
        pair[0].continue_ids([list(range(4, 4 + P + T))], 4, greedy=True, sampling=(1.0, 0, 1.0))


def test_the_gateway_served_by_vllm(pair):
    """The real openai client against the gateway over the vLLM engine: the captured prompt is
    the chat template's rendering, the sampled ids and log-probs are the engine's and the
    trainer's recomputation; a greedy completion is the engine's continue_ids."""
    import openai

    from reinforge.agents.parsers import get_parser
    from reinforge.gateway.server import Gateway
    from tests.gateway.gateway_helpers import model_log_probs

    vllm, lean = pair
    tok = vllm.tok
    gw = Gateway(vllm, tok, get_parser("tag"), api_key="secret")
    gw.start()
    try:
        client = openai.OpenAI(base_url=gw.base_url("r1"), api_key="secret", max_retries=0, timeout=60)
        gw.open_rollout("r1")
        messages = [{"role": "user", "content": "12*34="}]
        r = client.chat.completions.create(model="policy", messages=messages, max_tokens=6, n=2, logprobs=True,
                                           temperature=1.0)
        log = gw.end_rollout("r1")
        rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"]
        assert r.model_extra["prompt_token_ids"] == rendered and len(log.calls) == 2
        for choice, call in zip(r.choices, log.calls):
            assert list(call.prompt_ids) == rendered and choice.model_extra["token_ids"] == list(call.sampled_ids)
            assert 1 <= len(call.sampled_ids) <= 6
            assert [x.logprob for x in choice.logprobs.content] == pytest.approx(list(call.log_probs))
            torch.testing.assert_close(torch.as_tensor(call.log_probs),
                                       model_log_probs(lean.model, rendered, list(call.sampled_ids)),
                                       atol=1e-4, rtol=1e-4)
        prompt = CONTEXTS[1]
        want, want_lp = vllm.continue_ids([prompt], 5, greedy=True, sampling=(1.0, 0, 1.0))
        turn = _turn(want[0], vllm.eos_ids)
        c = openai.OpenAI(base_url=gw.base_url(), api_key="secret", max_retries=0, timeout=60)
        got = c.completions.create(model="policy", prompt=prompt, max_tokens=5, temperature=0, logprobs=0)
        assert got.choices[0].model_extra["token_ids"] == turn
        assert got.choices[0].logprobs.token_logprobs == pytest.approx(want_lp[0, :len(turn)].tolist(), abs=1e-5)
        assert gw.counters["errors"] == 0
    finally:
        gw.close()
