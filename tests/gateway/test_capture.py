"""The pure capture functions: trajectories rebuilt from calls by id prefixes, and prompts rendered
with the sampled ids of earlier turns (gateway/capture.py, gateway/render.py)."""
from __future__ import annotations

import pytest

from reinforge.agents.parsers import get_parser
from reinforge.gateway.capture import Call, rebuild
from reinforge.gateway.render import (RequestError, Turn, assistant_message, normalize, prompt_ids, render_fresh,
                                      request_tools)


def call(prompt, sampled, version=0):
    return Call(tuple(prompt), tuple(sampled), tuple(-0.5 - 0.1 * i for i in range(len(sampled))), version)


def test_one_chain_masks_only_sampled_ids():
    c1 = call([1, 2, 3], [10, 11])
    c2 = call([1, 2, 3, 10, 11, 20, 21], [12, 13, 14], version=1)  # harness added 20, 21
    c3 = call([1, 2, 3, 10, 11, 20, 21, 12, 13, 14, 22], [15], version=1)
    r = rebuild([c1, c2, c3])
    assert (r.edited, r.forks, len(r.sequences)) == (0, 0, 1)
    s = r.sequences[0]
    assert s.prompt_ids == [1, 2, 3]
    assert s.response_ids == [10, 11, 20, 21, 12, 13, 14, 22, 15]
    assert s.mask == [1, 1, 0, 0, 1, 1, 1, 0, 1]
    assert s.log_probs == [-0.5, -0.6, 0.0, 0.0, -0.5, -0.6, -0.7, 0.0, -0.5]
    assert s.versions == [0, 0, -1, -1, 1, 1, 1, -1, 1]
    assert s.turn_ends == [1, 6, 8] and s.calls == [0, 1, 2]


def test_edited_history_starts_a_new_sequence():
    c1 = call([1, 2, 3], [10, 11])
    c2 = call([1, 2, 3, 10, 99, 20], [12])  # the harness rewrote the sampled 11 as 99
    r = rebuild([c1, c2])
    assert (r.edited, len(r.sequences)) == (1, 2)
    assert [s.prompt_ids for s in r.sequences] == [[1, 2, 3], [1, 2, 3, 10, 99, 20]]
    assert all(s.mask == [1] * len(s.response_ids) for s in r.sequences)


def test_fork_and_longest_parent():
    c1 = call([1], [2])
    a = call([1, 2, 5], [6])  # two continuations of c1: a fork
    b = call([1, 2, 7], [8])
    c = call([1, 2, 5, 6, 9], [4])  # continues a (the longest prefix), not c1
    r = rebuild([c1, a, b, c])
    assert (r.edited, r.forks) == (0, 1)
    assert sorted(s.calls for s in r.sequences) == [[0, 1, 3], [0, 2]]


def test_call_needs_one_log_prob_per_id():
    with pytest.raises(ValueError, match="log-probs"):
        Call((1,), (2, 3), (0.0,))


def test_normalize_and_errors():
    msgs = normalize([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                      {"role": "assistant", "content": None, "refusal": None,
                       "tool_calls": [{"id": "x", "type": "function",
                                       "function": {"name": "f", "arguments": '{"q": 1}'}}]},
                      {"role": "tool", "tool_call_id": "x", "content": "2"}])
    assert msgs == [{"role": "user", "content": "ab"},
                    {"role": "assistant", "content": "", "tool_calls": [{"name": "f", "arguments": {"q": 1}}]},
                    {"role": "tool", "content": "2", "tool_call_id": "x"}]
    for bad in ([], [{"role": "robot", "content": "x"}], [{"role": "user", "content": 3}],
                [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}]):
        with pytest.raises(RequestError):
            normalize(bad)


def test_char_template_tag_parser_turns():
    """The calculator's format: the prompt renders to its text; a continued turn appends the
    sampled ids then <r>result</r>, as the agent loop does."""
    from reinforge.tasks import build_char_tokenizer

    tok, parser = build_char_tokenizer(), get_parser("tag")
    tools = request_tools([{"type": "function", "function": {"name": "calculator", "parameters": {
        "type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}])
    first = normalize([{"role": "user", "content": "12*3="}])
    ids, cont = prompt_ids(tok, parser, first, tools, [])
    assert not cont and ids == tok("12*3=", add_special_tokens=False)["input_ids"]
    sampled = tok("<calculator>12*3</calculator>", add_special_tokens=False)["input_ids"]
    msg, calls = assistant_message(tok, parser, sampled, tools)
    assert msg == {"role": "assistant", "content": "", "tool_calls": [{"name": "calculator",
                                                                       "arguments": {"expression": "12*3"}}]}
    turn = Turn(first, msg, tuple(ids + sampled), tok.decode(sampled, skip_special_tokens=False))
    nxt = normalize([{"role": "user", "content": "12*3="},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": "c0", "type": "function", "function": {"name": "calculator",
                                                                       "arguments": '{"expression": "12*3"}'}}]},
                     {"role": "tool", "tool_call_id": "c0", "content": "36"}])
    ids2, cont = prompt_ids(tok, parser, nxt, tools, [turn])
    assert cont and ids2 == ids + sampled + tok("<r>36</r>", add_special_tokens=False)["input_ids"]
    edited = [nxt[0], {**nxt[1], "tool_calls": [{"name": "calculator", "arguments": {"expression": "12*4"}}]}, nxt[2]]
    assert prompt_ids(tok, parser, edited, tools, [turn])[1] is False


def test_bpe_merge_across_a_turn_boundary_keeps_sampled_ids(real_tok):
    """Qwen2's BPE: the policy sampled "Hel" + "lo" (two tokens) where encoding the text gives
    one; the next call's prompt holds the sampled ids, and the trained sequence is one chain."""
    tok, parser = real_tok("qwen2.5-0.5b"), get_parser("hermes")
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    first = normalize([{"role": "user", "content": "Say hello"}])
    ids, _ = prompt_ids(tok, parser, first, [], [])
    assert ids == tok.apply_chat_template([{"role": "user", "content": "Say hello"}], add_generation_prompt=True,
                                          tokenize=True, return_dict=True)["input_ids"]
    sampled = enc("Hel") + enc("lo") + [im_end]
    assert enc("Hello") != enc("Hel") + enc("lo")  # the merge the re-encoding would make
    msg, _ = assistant_message(tok, parser, sampled, [])
    assert msg == {"role": "assistant", "content": "Hello"}
    turn = Turn(first, msg, tuple(ids + sampled), tok.decode(sampled, skip_special_tokens=False))
    convo = first + [msg, {"role": "user", "content": "Again"}]
    ids2, cont = prompt_ids(tok, parser, convo, [], [turn])
    assert cont and ids2[:len(ids) + len(sampled)] == ids + sampled
    fresh = render_fresh(tok, convo, [])
    assert tok.decode(ids2) == tok.decode(fresh)  # the same text ...
    assert ids2 != fresh  # ... but the sampled ids, not the re-encoding
    r = rebuild([Call(tuple(ids), tuple(sampled), (0.0,) * len(sampled)), Call(tuple(ids2), (5,), (0.0,))])
    assert len(r.sequences) == 1 and r.edited == 0
    s = r.sequences[0]
    assert s.response_ids[:len(sampled)] == sampled and s.mask[:len(sampled)] == [1] * len(sampled)
