"""Multi-turn `hermes` tool episodes with the real Qwen2 BPE (docs/agents.md): an episode is token
for token the chat template's rendering of its conversation, with the Qwen2.5 tokenizer (where
<tool_call> is one token) and with the GGUF's own (where `"}}</tool_call>` is split by BPE
merges inside the stop string); where a turn's first tokens would merge with the prompt's last
one ("\\n" + "\\n"), the episode keeps the sampled ids and only the text matches."""
from __future__ import annotations

import pytest

from reinforge.agents.base import Tool
from reinforge.agents.loop import AgentRollout
from reinforge.agents.parsers import get_parser
from reinforge.trainers.validation import prompts_batch
from reinforge.workers.rollout.common import stop_tokens
from tests.agents.test_loop import Scripted

CALC = Tool("calc", "arithmetic", {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
            fn=lambda expr: str(eval(expr)))  # noqa: S307 - fixed test inputs
USER = {"role": "user", "content": "What is 12*3? Use the calculator."}
CALL = '<tool_call>\n{"name": "calc", "arguments": {"expr": "12*3"}}\n</tool_call>'  # as Qwen2.5's format writes it
TIGHT_CALL = '<tool_call>{"name": "calc", "arguments": {"expr": "12*3"}}</tool_call>'  # BPE merges the tags with the JSON


def _episode(tok, second_turn: str, with_tools: bool, call: str = CALL):
    """Run a scripted two-turn episode (a call, the result, `second_turn`) -> (prompt ids, the
    episode's response ids, their generated mask, the trajectory)."""
    kw = {"tools": [CALC.schema()]} if with_tools else {}
    text = tok.apply_chat_template([USER], add_generation_prompt=True, tokenize=False, **kw)
    prompt = tok(text, add_special_tokens=False)["input_ids"]

    def script(ctx: str) -> list[int]:
        # Before the tool's result ("36") the policy calls; the loop cuts that turn at </tool_call>.
        turn = second_turn if "36" in ctx else call
        return tok(turn + "<|im_end|>", add_special_tokens=False)["input_ids"]

    engine = Scripted(tok, script, P=len(prompt), T=160)
    engine.eos_ids = stop_tokens(tok, tok.eos_token_id)  # as a real backend: <|endoftext|> and <|im_end|>
    batch = prompts_batch([{"prompt_ids": prompt, "prompt_text": text, "ground_truth": "36", "extra": {}}], 0)
    out = AgentRollout(engine, tok, max_turns=3, parser=get_parser("hermes"), tools={"calc": CALC}).generate(batch, n=1)
    valid = out["attention_mask"][0, len(prompt):].bool()
    return prompt, out["responses"][0][valid].tolist(), out["response_mask"][0][valid].tolist(), out["trajectory"][0]


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "gguf-qwen2"])
def test_hermes_episode_is_the_templates_tokens(real_tok, name):
    tok = real_tok(name)
    with_tools = name != "gguf-qwen2"  # the GGUF's ChatML template has no tools= block
    call = CALL if with_tools else TIGHT_CALL
    prompt, ids, gen, traj = _episode(tok, "12*3 = 36", with_tools, call)
    assert (traj["turns"], traj["tool_calls"], traj["tool_errors"]) == (2, 1, 0), traj
    conv = [USER, {"role": "assistant", "content": call}, {"role": "tool", "content": "36"},
            {"role": "assistant", "content": "12*3 = 36"}]
    rendered = tok.apply_chat_template(conv, tokenize=False, **({"tools": [CALC.schema()]} if with_tools else {}))
    # Token-exact: the episode is the template's rendering encoded as one text (but for the
    # newline after the last <|im_end|>, where the episode ends).
    assert prompt + ids == tok(rendered.rstrip("\n"), add_special_tokens=False)["input_ids"]
    call_ids = tok(call, add_special_tokens=False)["input_ids"]
    if name == "gguf-qwen2":  # the stop string spans 4 BPE tokens, the first merged with the JSON's end
        assert [tok.decode([t]) for t in call_ids[-4:]] == ["}}</", "tool", "_call", ">"]
    else:
        assert call_ids[0] == 151657 and call_ids[-1] == 151658
    # What was generated (trained on): the call cut right after </tool_call>, then the answer
    # with its <|im_end|>; the call turn's <|im_end|> and the tool turn are the observation.
    generated = [t for t, g in zip(ids, gen) if g]
    assert tok.decode(generated, skip_special_tokens=False) == call + "12*3 = 36<|im_end|>"
    assert ids[len(call_ids)] == 151645 and gen[len(call_ids)] == 0


def test_a_merge_across_the_turn_boundary_keeps_the_sampled_ids(real_tok):
    tok = real_tok("qwen2.5-0.5b")
    prompt, ids, gen, _ = _episode(tok, "\n36", True)
    conv = [USER, {"role": "assistant", "content": CALL}, {"role": "tool", "content": "36"},
            {"role": "assistant", "content": "\n36"}]
    rendered = tok.apply_chat_template(conv, tools=[CALC.schema()], tokenize=False).rstrip("\n")
    joint = tok(rendered, add_special_tokens=False)["input_ids"]
    assert tok.decode(prompt + ids, skip_special_tokens=False) == rendered  # the same text ...
    nl, nlnl = tok("\n", add_special_tokens=False)["input_ids"], tok("\n\n", add_special_tokens=False)["input_ids"]
    assert len(nl) == len(nlnl) == 1
    # ... but encoded as one text, "assistant\n" + "\n36" merges into "\n\n": the episode keeps the
    # two "\n" it has (the observation's last, the turn's first), which is what the policy sampled.
    assert prompt + ids != joint and len(prompt + ids) == len(joint) + 1
    first = next(k for k in range(len(ids)) if gen[k] and k > 0 and not gen[k - 1])  # the second turn's start
    assert ids[first - 1:first + 1] == nl + nl and gen[first - 1] == 0
    assert joint[len(prompt) + first - 1] == nlnl[0]
