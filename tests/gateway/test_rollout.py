"""rollout.agent's rollout (gateway/rollout.py) over the tiny model's lean engine: the Batch,
the token-exact masks and log-probs, and the faults (hangs, raises, no call, bad returns,
edited histories, disconnects, 64 agents at once)."""
from __future__ import annotations

import socket
import threading
import time
import json

import openai
import pytest
import torch

from reinforge.agents.parsers import get_parser
from reinforge.gateway.rollout import GatewayRollout
from reinforge.trainers.validation import prompts_batch
from gateway_agents import (async_digits, bad_return, digits, edits_history, hangs, never_calls, raises, slow_async,
                            two_turns)
from gateway_helpers import model_log_probs, tiny_engine

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return tiny_engine(tiny_model_dir, T=12)


def prompts(tok, texts=("1+2=", "3*4=", "5-1="), truths=("0", "1", "1")):
    items = [{"prompt_ids": tok(t, add_special_tokens=False)["input_ids"], "prompt_text": t, "ground_truth": g,
              "data_source": "t", "extra": {"k": i}, "prompt_raw": [{"role": "user", "content": t}]}
             for i, (t, g) in enumerate(zip(texts, truths))]
    return prompts_batch(items, 10)


def make(engine, agent, **kw):
    eng, tok = engine
    return GatewayRollout(eng, tok, agent, parser=get_parser("tag"), **kw), tok


def rollout_batch(engine, agent, n: int, **kw):
    """One `generate` (n per prompt, T=1) of a GatewayRollout around `agent` over the default
    prompts, the rollout closed after it -> (batch, tokenizer)."""
    ro, tok = make(engine, agent, **kw)
    try:
        return ro.generate(prompts(tok), n=n, temperature=1.0), tok
    finally:
        ro.close()


def test_batch_is_token_exact(engine):
    b, tok = rollout_batch(engine, digits, 2)
    assert len(b) == 6 and b["group_ids"].tolist() == [10, 10, 11, 11, 12, 12]
    assert b["responses"].shape == (6, 12) and b["prompts"].shape == (6, 32)
    for i in range(6):
        prompt = b["prompts"][i][b["attention_mask"][i, :32].bool()].tolist()
        assert prompt == tok(b["prompt_text"][i], add_special_tokens=False)["input_ids"] == b["prompt_ids"][i]
        m = b["response_mask"][i].bool()
        sampled = b["responses"][i][m].tolist()
        assert m[:len(sampled)].all()  # one call: the sampled ids lead the response
        want = model_log_probs(engine[0].model, prompt, sampled)
        torch.testing.assert_close(b["rollout_log_probs"][i][m], want, atol=1e-4, rtol=1e-4)
        t = b["trajectory"][i]
        text = tok.decode(sampled, skip_special_tokens=True)
        assert t["turn_rewards"] == [pytest.approx(sum(c.isdigit() for c in text) / max(len(text), 1))]
        assert t["agent_metrics"] == {"answer_chars": float(len(text))} and t["turn_ends"] == [len(sampled) - 1]
    assert b["trajectory"][0]["gateway"]["runs"] == 6.0 and b["trajectory"][0]["gateway"]["dropped"] == 0.0
    assert all(t["weight_versions"] == [0] for t in b["trajectory"])


def test_calls_are_stamped_with_the_weight_version(engine):
    ro, tok = make(engine, digits)
    try:
        ro.sync_weights(engine[0].model)  # the step's sync after an update: version 1
        b = ro.generate(prompts(tok), n=1)
    finally:
        ro.close()
    assert all(t["weight_versions"] == [1] for t in b["trajectory"])


def test_trainer_recomputation_matches(engine):
    """The actor's own log-prob pass over the Batch equals the recorded rollout log-probs."""
    from reinforge.config.schema import ModelConfig
    from reinforge.workers.reference import ReferenceWorker

    b, tok = rollout_batch(engine, two_turns, 1)
    assert len(b) == 3
    for i in range(3):  # sampled, then the harness's "+1=" (masked), then sampled again
        m = b["response_mask"][i].tolist()
        L = int(b["attention_mask"][i, 32:].sum())
        runs = [k for k in range(1, L) if m[k] != m[k - 1]]
        assert m[0] == 1 and len(runs) == 2, m
        harness = b["responses"][i, runs[0]:runs[1]].tolist()
        assert tok.decode(harness) == "+1="
    b.meta.update(temperature=1.0, top_k=0, top_p=1.0)
    ref = ReferenceWorker(engine[0].model, ModelConfig(path="x"), 4, 0)
    lp = ref.log_probs(b)["ref_log_probs"]
    mask = b["response_mask"].bool()
    torch.testing.assert_close(lp[mask], b["rollout_log_probs"][mask], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("agent,dropped", [(raises, "dropped_raised"), (never_calls, "dropped_no_calls"),
                                           (bad_return, "dropped_bad_return")])
def test_faulty_agents_are_dropped_and_counted(engine, agent, dropped):
    b, tok = rollout_batch(engine, agent, 2)
    g = b["trajectory"][0]["gateway"]
    assert len(b) == 6 and g["runs"] == 6.0
    bad = [0, 1] if agent is raises else list(range(6))  # raises: on the first prompt's runs only
    assert g[dropped] == float(len(bad)) and g["dropped"] == float(len(bad))
    for i in range(6):
        t = b["trajectory"][i]
        if i in bad:  # a void row: no trained token, a group of its own
            assert t["dropped"] == dropped.removeprefix("dropped_") and b["response_mask"][i].sum() == 0
            assert b["group_ids"][i] < 0 and b["attention_mask"][i, 32:].sum() == 0
        else:
            assert "dropped" not in t and b["response_mask"][i].sum() > 0 and b["group_ids"][i] == 10 + i // 2
    assert len(set(b["group_ids"][bad].tolist())) == len(bad)


def test_hanging_agents_hit_their_deadline(engine):
    ro, tok = make(engine, hangs, timeout_s=1.5)
    try:
        t0 = time.monotonic()
        b = ro.generate(prompts(tok), n=2)
        took = time.monotonic() - t0
        g = b["trajectory"][0]["gateway"]
        assert g["dropped_timeout"] == 2.0 and len(b) == 6 and took < 10
        assert [t.get("dropped") for t in b["trajectory"]] == ["timeout"] * 2 + [None] * 4
        # a hung run's rollout is closed: a late call from it is refused
        ro2 = make(engine, slow_async, timeout_s=0.5)[0]
        try:
            late = ro2.generate(prompts(tok), n=1)
            assert late["trajectory"][0]["gateway"]["dropped_timeout"] == 3.0 and late["response_mask"].sum() == 0
        finally:
            ro2.close()
    finally:
        ro.close()


@pytest.mark.slow
def test_async_agent_and_64_concurrent(engine):
    ro, tok = make(engine, async_digits, concurrency=64)
    texts = [f"{a}+{b}=" for a in range(8) for b in range(8)]
    try:
        b = ro.generate(prompts(tok, texts, ["1"] * 64), n=1)
        calls = ro.gateway.counters
    finally:
        ro.close()
    assert len(b) == 64 and b["trajectory"][0]["gateway"]["calls"] == 64.0
    assert calls["engine_calls"] < 64  # concurrent requests were batched into fewer engine calls
    assert sorted(b["group_ids"].tolist()) == list(range(10, 74))


@pytest.mark.parametrize("rule,rows", [("split", 6), ("drop", 3)])
def test_edited_history_rule(engine, rule, rows):
    b, tok = rollout_batch(engine, edits_history, 1, history=rule)
    assert len(b) == rows and b["trajectory"][0]["gateway"]["edited_calls"] == 3.0
    if rule == "split":  # the rows of the second calls first, then the first calls' sequences
        assert b["group_ids"].tolist() == [10, 11, 12, 10, 11, 12]
        assert all(t["turn_rewards"] == [0.5] for t in b["trajectory"])
        for i in range(3):  # the second call's prompt holds the edited answer "99", as the harness sent it
            prompt = b["prompts"][i][b["attention_mask"][i, :32].bool()].tolist()
            assert tok.decode(prompt).endswith("99+1=")
    else:
        assert b["response_mask"].sum() == 0 and b["trajectory"][0]["gateway"]["dropped_edited"] == 3.0


def test_client_disconnect_mid_generation(engine):
    """A client that goes away while its call is generating: the call is not recorded, the
    server answers the next request."""
    eng, tok = engine
    ro, _ = make(engine, digits)
    gw = ro.gateway
    gw.start()
    slow = eng.continue_ids
    started = threading.Event()

    def slower(*a, **k):
        started.set()
        time.sleep(0.5)
        return slow(*a, **k)

    eng.continue_ids = slower
    try:
        gw.open_rollout("d")
        body = json.dumps({"model": "policy", "messages": [{"role": "user", "content": "1+1="}], "max_tokens": 4})
        s = socket.create_connection(("127.0.0.1", gw.port))
        s.sendall((f"POST /rollouts/d/v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Authorization: Bearer {ro.api_key}\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
        assert started.wait(10)
        s.close()
        time.sleep(1.0)
        log = gw.end_rollout("d")
        assert log.calls == [] and log.disconnected == 1
        c = openai.OpenAI(base_url=gw.base_url(), api_key=ro.api_key, max_retries=0)
        assert c.chat.completions.create(model="p", messages=[{"role": "user", "content": "2="}], max_tokens=2).choices
    finally:
        eng.continue_ids = slow
        ro.close()


def test_row_versions_fill_harness_and_padding():
    from reinforge.gateway.rollout import row_versions

    assert row_versions([3, 3, -1, -1, 4], 7).tolist() == [3, 3, 3, 3, 4, 4, 4]
    assert row_versions([-1, 2, -1], 4).tolist() == [2, 2, 2, 2]  # a leading harness id: the oldest stamp
    assert row_versions([], 2).tolist() == [0, 0]
