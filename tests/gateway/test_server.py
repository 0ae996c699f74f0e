"""The gateway over real HTTP on 127.0.0.1 with the real `openai` client: capture exact to the
chat template and the engine, tool calls through `tools=`, OpenAI-style errors (gateway/server.py)."""
from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request

import openai
import pytest
import torch

from reinforge.agents.parsers import get_parser
from reinforge.gateway.capture import rebuild
from reinforge.gateway.server import Gateway
from gateway_helpers import ScriptedEngine, model_log_probs, tiny_engine

pytestmark = pytest.mark.usefixtures("one_thread")
CALC = {"type": "function", "function": {"name": "calculator", "description": "evaluates arithmetic",
                                         "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                        "required": ["expression"]}}}


@contextlib.contextmanager
def scripted_gateway(engine, tok, parser: str):
    """A started Gateway over `engine` (a ScriptedEngine) with tool-call parser `parser`, closed after."""
    gw = Gateway(engine, tok, get_parser(parser), api_key="secret")
    gw.start()
    try:
        yield gw
    finally:
        gw.close()


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    engine, tok = tiny_engine(tiny_model_dir)
    gw = Gateway(engine, tok, get_parser("tag"), api_key="secret")
    gw.start()
    yield gw, engine, tok
    gw.close()


def client(gw, rollout=None):
    return openai.OpenAI(base_url=gw.base_url(rollout), api_key="secret", max_retries=0, timeout=60)


def test_models_route(served):
    gw, _, _ = served
    assert [m.id for m in client(gw).models.list().data] == ["policy"]


def test_chat_capture_is_the_template_and_the_engine(served):
    gw, engine, tok = served
    gw.open_rollout("r1")
    messages = [{"role": "user", "content": "12*34="}]
    r = client(gw, "r1").chat.completions.create(model="policy", messages=messages, max_tokens=6, n=2,
                                                logprobs=True, temperature=1.0)
    log = gw.end_rollout("r1")
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert len(log.calls) == 2 and all(list(c.prompt_ids) == rendered for c in log.calls)
    assert r.model_extra["prompt_token_ids"] == rendered
    for choice, c in zip(r.choices, log.calls):
        assert choice.model_extra["token_ids"] == list(c.sampled_ids)
        assert [x.logprob for x in choice.logprobs.content] == pytest.approx(list(c.log_probs))
        assert choice.message.content == tok.decode(list(c.sampled_ids), skip_special_tokens=True)
        # the trainer's recomputation of the same ids
        torch.testing.assert_close(torch.as_tensor(c.log_probs), model_log_probs(engine.model, rendered, list(c.sampled_ids)),
                                   atol=1e-4, rtol=1e-4)
    assert r.usage.prompt_tokens == len(rendered)


def test_greedy_equals_the_engine_and_completions(served):
    gw, engine, tok = served
    prompt = tok("7*8=", add_special_tokens=False)["input_ids"]
    want, want_lp = engine.continue_ids([prompt], 5, greedy=True, sampling=(1.0, 0, 1.0))
    ids = want[0].tolist()
    eos = next((k + 1 for k, t in enumerate(ids) if t in engine.eos_ids), len(ids))
    r = client(gw).completions.create(model="policy", prompt=prompt, max_tokens=5, temperature=0, logprobs=0)
    assert r.choices[0].model_extra["token_ids"] == ids[:eos]
    assert r.choices[0].logprobs.token_logprobs == pytest.approx(want_lp[0, :eos].tolist(), abs=1e-5)
    assert r.choices[0].text == tok.decode(ids[:eos], skip_special_tokens=True)
    text = client(gw).completions.create(model="policy", prompt="7*8=", max_tokens=5, temperature=0)
    assert text.choices[0].model_extra["token_ids"] == ids[:eos]


def test_tool_calls_through_tools_make_one_sequence(served):
    """Two turns through the client's tools= API: call, tool result, answer. The rebuilt
    sequence is prompt + call (mask 1) + <r>36</r> (mask 0) + answer (mask 1)."""
    gw, engine, tok = served
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    eos = tok.eos_token_id
    scripted = ScriptedEngine(engine, [enc("<calculator>12*3</calculator>"), enc("36") + [eos]])
    with scripted_gateway(scripted, tok, "tag") as gw2:
        gw2.open_rollout("a")
        c = client(gw2, "a")
        msgs = [{"role": "user", "content": "12*3="}]
        r1 = c.chat.completions.create(model="policy", messages=msgs, tools=[CALC])
        m = r1.choices[0].message
        assert r1.choices[0].finish_reason == "tool_calls" and m.content is None
        assert m.tool_calls[0].function.name == "calculator"
        assert json.loads(m.tool_calls[0].function.arguments) == {"expression": "12*3"}
        msgs += [m, {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "36"}]
        r2 = c.chat.completions.create(model="policy", messages=msgs, tools=[CALC])
        assert r2.choices[0].message.content == "36" and r2.choices[0].finish_reason == "stop"
        log = gw2.end_rollout("a")
    r = rebuild(log.calls)
    assert (len(r.sequences), r.edited) == (1, 0)
    s = r.sequences[0]
    assert s.prompt_ids == enc("12*3=")
    assert s.response_ids == enc("<calculator>12*3</calculator>") + enc("<r>36</r>") + enc("36") + [eos]
    n_call, n_obs = len(enc("<calculator>12*3</calculator>")), len(enc("<r>36</r>"))
    assert s.mask == [1] * n_call + [0] * n_obs + [1] * 3
    # the engine saw exactly those contexts, and the log-probs are the model's on them
    assert scripted.contexts == [s.prompt_ids, s.prompt_ids + s.response_ids[:n_call + n_obs]]
    full = s.prompt_ids + s.response_ids
    want = model_log_probs(engine.model, s.prompt_ids, s.response_ids)
    got = torch.as_tensor(s.log_probs)
    keep = torch.as_tensor(s.mask).bool()
    torch.testing.assert_close(got[keep], want[keep], atol=1e-4, rtol=1e-4)
    assert len(full) == len(s.prompt_ids) + len(s.mask)


def test_stream_is_the_whole_answer_in_openai_chunks(served):
    """stream=True through the openai client: the chunks carry what the plain answer carries."""
    gw, _, _ = served
    c = client(gw)
    msgs = [{"role": "user", "content": "7*8="}]
    plain = c.chat.completions.create(model="policy", messages=msgs, max_tokens=5, temperature=0, logprobs=True)
    assert plain.choices[0].model_extra["token_ids"]  # something was sampled
    chunks = list(c.chat.completions.create(model="policy", messages=msgs, max_tokens=5, temperature=0, logprobs=True,
                                            stream=True, stream_options={"include_usage": True}))
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == plain.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices] == [None, plain.choices[0].finish_reason]
    lps = [x.logprob for ch in chunks if ch.choices and ch.choices[0].logprobs for x in ch.choices[0].logprobs.content]
    assert lps == pytest.approx([x.logprob for x in plain.choices[0].logprobs.content])
    assert chunks[0].choices[0].model_extra["token_ids"] == plain.choices[0].model_extra["token_ids"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    done = c.completions.create(model="policy", prompt="7*8=", max_tokens=5, temperature=0)
    streamed = list(c.completions.create(model="policy", prompt="7*8=", max_tokens=5, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in streamed) == done.choices[0].text
    assert streamed[-1].choices[0].finish_reason == done.choices[0].finish_reason


def test_streamed_tool_calls_continue_one_sequence(served):
    """An agent that streams: the tool call assembled from the deltas, sent back with the tool's
    result, continues the captured turn (one sequence), as a plain answer does."""
    gw, engine, tok = served
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    scripted = ScriptedEngine(engine, [enc("<calculator>12*3</calculator>"), enc("36") + [tok.eos_token_id]])
    with scripted_gateway(scripted, tok, "tag") as gw2:
        gw2.open_rollout("s")
        c = client(gw2, "s")
        msgs = [{"role": "user", "content": "12*3="}]
        calls, finish = {}, None
        for ch in c.chat.completions.create(model="policy", messages=msgs, tools=[CALC], stream=True):
            for d in ch.choices[0].delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": d.id, "type": "function",
                                                   "function": {"name": "", "arguments": ""}})
                entry["function"]["name"] += d.function.name or ""
                entry["function"]["arguments"] += d.function.arguments or ""
            finish = ch.choices[0].finish_reason or finish
        assert finish == "tool_calls" and json.loads(calls[0]["function"]["arguments"]) == {"expression": "12*3"}
        msgs += [{"role": "assistant", "content": None, "tool_calls": [calls[0]]},
                 {"role": "tool", "tool_call_id": calls[0]["id"], "content": "36"}]
        text = "".join(ch.choices[0].delta.content or "" for ch in
                       c.chat.completions.create(model="policy", messages=msgs, tools=[CALC], stream=True) if ch.choices)
        assert text == "36"
        log = gw2.end_rollout("s")
    r = rebuild(log.calls)
    assert (len(r.sequences), r.edited) == (1, 0) and log.continued == 1


def _post(url: str, data: bytes, key: str = "secret") -> tuple[int, dict]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json",
                                                          "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("body,status,param", [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (json.dumps({"model": "policy"}).encode(), 400, "messages"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 0}).encode(), 400, "n"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}).encode(), 400, "temperature"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}).encode(), 400, "tool_choice"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}).encode(), 400, "stream"),
    (json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True,
                 "stream_options": {"include_usage": 1}}).encode(), 400, "stream_options"),
])
def test_malformed_requests_get_openai_errors(served, body, status, param):
    gw, _, _ = served
    code, err = _post(gw.base_url() + "/chat/completions", body)
    assert code == status and set(err["error"]) == {"message", "type", "param", "code"}
    assert err["error"]["type"] == "invalid_request_error" and err["error"]["param"] == param
    # the server goes on
    ok = client(gw).chat.completions.create(model="policy", messages=[{"role": "user", "content": "1+1="}], max_tokens=2)
    assert ok.choices[0].message.role == "assistant"


def test_client_errors_auth_and_closed_rollouts(served):
    gw, _, _ = served
    code, err = _post(gw.base_url() + "/chat/completions", b"{}", key="wrong")
    assert code == 401 and err["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.BadRequestError, match="messages"):
        client(gw).chat.completions.create(model="policy", messages=[])
    with pytest.raises(openai.ConflictError, match="not open"):
        client(gw, "never").chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    gw.open_rollout("b", budget=3)
    c = client(gw, "b")
    r = c.completions.create(model="policy", prompt="1+", max_tokens=10)
    assert len(r.choices[0].model_extra["token_ids"]) <= 3  # the rollout's budget caps max_tokens
    gw.end_rollout("b")
    with pytest.raises(openai.ConflictError):
        c.completions.create(model="policy", prompt="1+", max_tokens=1)


@pytest.mark.slow
def test_hermes_tool_calls_on_a_chatml_template(real_qwen_dir):
    """Qwen2.5's format (hermes parser, ChatML template with tools=): the call is parsed into
    tool_calls, and the next prompt is the first prompt + the sampled ids + the template's tool
    turn, so one sequence whose mask covers the sampled ids only."""
    from transformers import AutoModelForCausalLM

    from reinforge.models.loading import load_tokenizer
    from reinforge.workers.rollout.lean import LeanRollout

    tok = load_tokenizer(real_qwen_dir)
    model = AutoModelForCausalLM.from_pretrained(real_qwen_dir, dtype=torch.float32).eval()
    engine = LeanRollout(model, tok, max_prompt_length=512, max_response_length=64)
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    call = enc('<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*3"}}\n</tool_call>') + [im_end]
    answer = enc("It is 36.") + [im_end]
    scripted = ScriptedEngine(engine, [call, answer])
    with scripted_gateway(scripted, tok, "hermes") as gw:
        gw.open_rollout("h")
        c = client(gw, "h")
        msgs = [{"role": "user", "content": "What is 12*3?"}]
        r1 = c.chat.completions.create(model="policy", messages=msgs, tools=[CALC])
        m = r1.choices[0].message
        assert r1.choices[0].finish_reason == "tool_calls" and m.tool_calls[0].function.name == "calculator"
        msgs += [m, {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "36"}]
        r2 = c.chat.completions.create(model="policy", messages=msgs, tools=[CALC])
        assert r2.choices[0].message.content == "It is 36."
        log = gw.end_rollout("h")
    first = tok.apply_chat_template([{"role": "user", "content": "What is 12*3?"}], tools=[CALC],
                                    add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    assert list(log.calls[0].prompt_ids) == first
    r = rebuild(log.calls)
    assert (len(r.sequences), r.edited) == (1, 0)
    s = r.sequences[0]
    sampled_call = call[:-1]  # the turn ends at the stop string </tool_call>, as in the agent loop
    n_obs = len(s.response_ids) - len(sampled_call) - len(answer)
    assert s.response_ids[:len(sampled_call)] == sampled_call and s.response_ids[-len(answer):] == answer
    assert s.mask == [1] * len(sampled_call) + [0] * n_obs + [1] * len(answer)
    obs = tok.decode(s.response_ids[len(sampled_call):len(sampled_call) + n_obs])
    assert obs == "<|im_end|>\n<|im_start|>user\n<tool_response>\n36\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


class Refusing:
    """The lean engine, refusing a context longer than `limit` ids with a ValueError (as vLLM
    refuses one beyond its max_model_len, or a temperature in (0, 0.01))."""

    def __init__(self, engine, limit: int):
        self.inner, self.limit = engine, limit
        self.T, self.eos_ids, self.top_k, self.micro_batch_size = engine.T, engine.eos_ids, 0, 64
        self.calls = 0

    def continue_ids(self, contexts, max_new, **kw):
        self.calls += 1
        if any(len(c) > self.limit for c in contexts):
            raise ValueError(f"a context is longer than {self.limit} tokens")
        return self.inner.continue_ids(contexts, max_new, **kw)


def test_an_engines_value_error_is_that_requests_400(served):
    """Two requests batched into one engine call, one of which the engine refuses: that one gets
    a 400 OpenAI error, the other its answer (each tried alone), and the server goes on."""
    from concurrent.futures import ThreadPoolExecutor

    _, engine, tok = served
    refusing = Refusing(engine, limit=len(tok("1+1=")["input_ids"]) + 8)
    gw = Gateway(refusing, tok, get_parser("tag"), api_key="secret", window_s=1.0)  # both in one batch
    gw.start()
    try:
        def ask(prompt):
            try:
                return client(gw).completions.create(model="policy", prompt=prompt, max_tokens=2)
            except openai.BadRequestError as e:
                return e
        with ThreadPoolExecutor(2) as pool:
            short, long = pool.map(ask, ["1+1=", "1+1=" * 20])
        assert isinstance(long, openai.BadRequestError) and long.status_code == 400
        assert "engine refused the request" in str(long) and long.body["type"] == "invalid_request_error"
        assert len(short.choices[0].model_extra["token_ids"]) <= 2
        assert refusing.calls == 3 and gw.counters["errors"] == 1  # the batch, then each alone
    finally:
        gw.close()
