"""The agent loop on a scripted engine (every turn's tokens chosen by the test) and on the tiny
model: masks, turn ends, stop strings, budget and max_turns, tools and environments, and
token-in/token-out where decoding and re-encoding would change the ids."""
from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from reinforge.agents.base import Environment, EnvStep, Tool
from reinforge.agents.loop import AgentRollout, StopScanner
from reinforge.agents.parsers import get_parser
from reinforge.tasks import build_char_tokenizer
from reinforge.trainers.validation import prompts_batch
from tests.agents.test_parsers import QWEN_LIKE

REV = Tool("rev", "reverse", {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]},
           fn=lambda s: s[::-1])
LP = -0.25  # the scripted engine's log-prob of every token


class Scripted:
    """An engine whose turn for a context is script(context text) (ids), cut at max_new; it
    ignores `stop` (as generate() does), so the loop's own cut is what is tested."""

    micro_batch_size, top_k, top_p = 2, 0, 1.0  # two rows a generate call: micro-batching runs too

    def __init__(self, tok, script, P=8, T=40):
        self.tok, self.script, self.P, self.T = tok, script, P, T
        self.eos_ids = [tok.eos_token_id]
        self.calls = []

    def continue_ids(self, contexts, max_new, *, greedy, sampling, stop=None):
        self.calls.append(len(contexts))
        ids = torch.full((len(contexts), max_new), self.tok.pad_token_id)
        for i, c in enumerate(contexts):
            turn = self.script(self.tok.decode(c, skip_special_tokens=False))[:max_new]
            ids[i, :len(turn)] = torch.as_tensor(turn)
        return ids, torch.full((len(contexts), max_new), LP)


def _items(tok, prompts, **row):
    return prompts_batch([{"prompt_ids": tok(p)["input_ids"], "prompt_text": p, "ground_truth": "0", "extra": dict(row)}
                          for p in prompts], 0)


def _enc(tok, text, eos=False):
    return tok(text, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_tool_episode_masks_observations_and_records_turns(tok):
    # Turn 1 calls rev and keeps talking past the stop string (cut there); turn 2 answers.
    def script(ctx):
        return _enc(tok, "<rev>ab</rev>junk") if "<r>" not in ctx else _enc(tok, "ba", eos=True)

    eng = Scripted(tok, script)
    out = AgentRollout(eng, tok, max_turns=4, parser=get_parser("tag"), tools={"rev": REV}).generate(
        _items(tok, ["x=", "y="]), n=2)
    call, obs, answer = _enc(tok, "<rev>ab</rev>"), _enc(tok, "<r>ba</r>"), _enc(tok, "ba", eos=True)
    L = len(call) + len(obs) + len(answer)
    for i in range(4):
        assert out["responses"][i, :L].tolist() == call + obs + answer
        assert out["response_mask"][i, :L].tolist() == [1] * len(call) + [0] * len(obs) + [1] * len(answer)
        assert out["response_mask"][i, L:].sum() == 0 and out["attention_mask"][i, 8:].tolist() == [1] * L + [0] * (40 - L)
        assert torch.equal(out["rollout_log_probs"][i], LP * out["response_mask"][i].float())
        t = out["trajectory"][i]
        assert (t["turns"], t["turn_ends"], t["tool_calls"], t["tool_errors"]) == (2, [len(call) - 1, L - 1], 1, 0)
        assert [m["role"] for m in t["messages"]] == ["assistant", "tool", "assistant"]
        assert t["messages"][1]["content"] == "ba" and not t["truncated"] and not t["budget_exhausted"]
        assert [(c["turn"], c["name"], c["arguments"], c["error"]) for c in t["calls"]] == [(0, "rev", {"s": "ab"}, False)]
    assert not out["truncated"].any() and out["group_ids"].tolist() == [0, 0, 1, 1]
    assert eng.calls == [2, 2, 2, 2]  # 4 episodes, 2 turns, micro-batches of 2: one call a turn per micro-batch


def test_max_turns_and_budget_end_episodes_as_truncated(tok):
    always_call = lambda ctx: _enc(tok, "<rev>abc</rev>")  # noqa: E731 - never answers
    out = AgentRollout(Scripted(tok, always_call), tok, max_turns=2, parser=get_parser("tag"),
                       tools={"rev": REV}).generate(_items(tok, ["x="]), n=1)
    t = out["trajectory"][0]
    assert t["turns"] == 2 and t["tool_calls"] == 1 and t["truncated"] and not t["budget_exhausted"]
    assert out["truncated"].tolist() == [True]
    # A budget of 20: call (14) + result (10) does not fit; the observation is cut at the budget.
    out = AgentRollout(Scripted(tok, always_call, T=20), tok, max_turns=5, parser=get_parser("tag"),
                       tools={"rev": REV}).generate(_items(tok, ["x="]), n=1)
    t = out["trajectory"][0]
    assert t["budget_exhausted"] and t["truncated"] and t["turns"] == 1
    assert out["attention_mask"][0, 8:].sum() == 20 and out["response_mask"][0].sum() == 14


def test_unknown_and_failing_calls_are_answered_and_counted(tok):
    def bad(s):
        raise ValueError("no")

    tools = {"rev": REV, "bad": Tool("bad", "fails", REV.parameters, bad)}
    script = lambda ctx: _enc(tok, "<bad>q</bad>") if "<r>" not in ctx else _enc(tok, "k", eos=True)  # noqa: E731
    out = AgentRollout(Scripted(tok, script, T=60), tok, max_turns=3, parser=get_parser("tag"), tools=tools).generate(
        _items(tok, ["x="]), n=1)
    t = out["trajectory"][0]
    assert t["tool_errors"] == 1 and t["messages"][1]["content"] == "error: ValueError: no" and t["turns"] == 2


def test_per_row_tools_column_replaces_the_config_tools(tok):
    script = lambda ctx: _enc(tok, "<rev>ab</rev>") if "<r>" not in ctx else _enc(tok, "k", eos=True)  # noqa: E731
    resolved = []
    loop = AgentRollout(Scripted(tok, script), tok, max_turns=3, parser=get_parser("tag"), tools={"rev": REV},
                        resolve_tools=lambda names: resolved.append(names) or {})
    out = loop.generate(_items(tok, ["x="], tools=["other"]), n=1)
    t = out["trajectory"][0]
    assert resolved == [["other"]] and t["tool_calls"] == 0 and t["turns"] == 1  # no tools: the text is an answer


class Countdown(Environment):
    """Three turns; reward 1 on the turn whose text holds 'go'; observations '[k]'."""

    def reset(self, row):
        self.k = 0
        return "start:"

    def step(self, action):
        self.k += 1
        return EnvStep(f"[{self.k}]", reward=float("go" in action), done=self.k == 3)


def test_environment_episode(tok):
    script = lambda ctx: _enc(tok, "go" if ctx.count("[") == 1 else "no", eos=True)  # noqa: E731
    out = AgentRollout(Scripted(tok, script), tok, max_turns=5, parser=get_parser("tag"),
                       env_factory=Countdown).generate(_items(tok, ["x="]), n=2)
    first, turn, o1, o2 = _enc(tok, "start:"), 3, _enc(tok, "[1]"), _enc(tok, "[2]")
    for i in range(2):
        t = out["trajectory"][i]
        assert t["turn_rewards"] == [0.0, 1.0, 0.0] and t["turns"] == 3 and not t["truncated"]
        want = first + _enc(tok, "no", True) + o1 + _enc(tok, "go", True) + o2 + _enc(tok, "no", True)
        assert out["responses"][i, :len(want)].tolist() == want
        s = len(first)
        assert t["turn_ends"] == [s + turn - 1, s + 2 * turn + len(o1) - 1, s + 3 * turn + 2 * len(o1) - 1]
        assert out["response_mask"][i, :s].sum() == 0 and out["response_mask"][i].sum() == 3 * turn


def test_stop_scanner_cuts_at_the_first_stop_string(tok):
    s = StopScanner(tok, ["</rev>"])
    ids = _enc(tok, "a</rev>b</rev>")
    assert s.first_cut(ids) == 7 and s.hit(ids[:7]) and not s.hit(ids[:6])
    assert StopScanner(tok, []).first_cut(ids) == len(ids)


def _merge_tokenizer():
    """A BPE tokenizer with the merge a + b -> ab: the ids [a, b] decode to 'ab', which encodes as [ab]."""
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, "a": 3, "b": 4, "ab": 5, "<": 6, ">": 7, "/": 8, "r": 9,
             "e": 10, "v": 11, "=": 12, "x": 13}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    core.add_special_tokens(["<pad>", "<eos>", "<unk>"])
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def test_generated_ids_are_kept_where_re_encoding_would_merge_them():
    tok = _merge_tokenizer()
    assert tok("ab", add_special_tokens=False)["input_ids"] == [5]  # what decode-then-encode would give
    sampled = [3, 4, 1]  # the policy sampled 'a', 'b' as two tokens, then EOS
    out = AgentRollout(Scripted(tok, lambda ctx: sampled), tok, max_turns=2, parser=get_parser("tag"),
                       tools={}).generate(_items(tok, ["x="]), n=1)
    assert out["responses"][0, :3].tolist() == sampled and out["response_mask"][0].tolist()[:4] == [1, 1, 1, 0]
    assert tok.decode(sampled, skip_special_tokens=True) == "ab"


# test_parsers' Qwen2.5-like template, plus a system turn listing `tools=` (HF renders with
# trim_blocks: a newline right after a block tag is dropped).
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    + QWEN_LIKE)


def test_hermes_episode_is_the_chat_templates_conversation(tmp_path):
    """A hermes episode (prompt rendered with tools=, a JSON call, the result as a tool message,
    an answer) is token for token the template's rendering of that conversation (but for the
    newline after the final <|im_end|>, where the episode ends)."""
    import json

    from reinforge.agents.loop import prompt_tools
    from reinforge.config.schema import RolloutConfig
    from reinforge.data import RLDataset

    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = HERMES_TEMPLATE
    tok.eos_token = "<|im_end|>"
    calc = Tool("calc", "arithmetic", {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
                fn=lambda expr: str(eval(expr)))  # noqa: S307 - fixed test inputs
    path = tmp_path / "rows.jsonl"
    user = {"role": "user", "content": "2*3?"}
    path.write_text(json.dumps({"prompt": [user], "ground_truth": "6"}) + "\n")
    r = RolloutConfig(max_turns=3, tool_parser="hermes", tools=[f"python:{__file__}:CALC_FOR_HERMES"])
    item = RLDataset(str(path), tok, max_prompt_length=512, tools=prompt_tools(r))[0]
    assert '"name": "calc"' in item["prompt_text"] and item["prompt_text"].endswith("<|im_start|>assistant\n")
    call = '<tool_call>{"name": "calc", "arguments": {"expr": "2*3"}}</tool_call>'
    script = lambda ctx: _enc(tok, call + "<|im_end|>" if "tool_response" not in ctx else "6<|im_end|>")  # noqa: E731
    batch = prompts_batch([{**item, "extra": {}}], 0)
    out = AgentRollout(Scripted(tok, script, P=len(item["prompt_ids"]), T=200), tok, max_turns=3,
                       parser=get_parser("hermes"), tools={"calc": calc}).generate(batch, n=1)
    t = out["trajectory"][0]
    assert (t["turns"], t["tool_calls"], t["tool_errors"]) == (2, 1, 0) and t["messages"][1]["content"] == "6"
    valid = out["attention_mask"][0, len(item["prompt_ids"]):].bool()
    episode = tok.decode(item["prompt_ids"] + out["responses"][0][valid].tolist(), skip_special_tokens=False)
    conv = [user, {"role": "assistant", "content": call}, {"role": "tool", "content": "6"},
            {"role": "assistant", "content": "6"}]
    rendered = tok.apply_chat_template(conv, tools=[calc.schema()], tokenize=False)
    assert episode == rendered.rstrip("\n")
    gen = out["response_mask"][0][valid].bool()
    generated = tok.decode(out["responses"][0][valid][gen].tolist(), skip_special_tokens=False)
    # the calling turn stops at </tool_call>: its <|im_end|> is the observation's first token
    assert generated == call + "6<|im_end|>"


CALC_FOR_HERMES = Tool("calc", "arithmetic", {"type": "object", "properties": {"expr": {"type": "string"}},
                                              "required": ["expr"]}, fn=lambda expr: "unused")
