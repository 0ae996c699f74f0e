"""Tool-call parsers: calls read from text, malformed calls kept as errors, stop strings, and
observation ids (tag: the tokenized result tag; hermes: the chat template's own rendering)."""
from __future__ import annotations

import pytest

from reinforge.agents.base import Tool
from reinforge.agents.parsers import HermesParser, TagParser, get_parser
from reinforge.tasks import build_char_tokenizer
from reinforge.tasks.tags import format_tag_result

CALC = Tool("calc", "arithmetic", {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
            fn=lambda expr: str(eval(expr)))  # noqa: S307 - test tool, fixed inputs
NOTE = Tool("note", "a note", {"type": "object", "properties": {"text": {"type": "string"}}}, fn=lambda text: "ok")
TOOLS = {"calc": CALC, "note": NOTE}

# A Qwen2.5-like template: consecutive tool messages in one user turn of <tool_response> blocks.
QWEN_LIKE = (
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def chat_tok():
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = QWEN_LIKE
    return tok


def test_tag_parses_closed_calls_into_the_first_parameter():
    calls = TagParser().parse("so <calc>12*3</calc> and <note>hi</note>", TOOLS)
    assert [(c.name, c.arguments, c.raw, c.error) for c in calls] == [
        ("calc", {"expr": "12*3"}, "<calc>12*3</calc>", ""), ("note", {"text": "hi"}, "<note>hi</note>", "")]


def test_tag_unclosed_call_is_an_error_and_unknown_tags_are_text():
    calls = TagParser().parse("<other>1</other> <calc>12*", TOOLS)
    assert len(calls) == 1 and calls[0].name == "calc" and "unclosed <calc>" in calls[0].error
    assert TagParser().parse("no call here", TOOLS) == []
    assert TagParser().stop_strings(TOOLS) == ["</calc>", "</note>"]


def test_tag_observation_is_the_tokenized_result_tag():
    tok = build_char_tokenizer()
    ids = TagParser().observation_ids(tok, [{"role": "tool", "content": "36"}, {"role": "user", "content": "go"}], "")
    assert ids == tok(format_tag_result("36") + "go", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == "<r>36</r>go"


def test_hermes_parses_json_calls_and_reports_malformed_ones():
    text = ('<tool_call>{"name": "calc", "arguments": {"expr": "2*3"}}</tool_call>'
            '<tool_call>{"name": "calc", "arguments": "{\\"expr\\": \\"1+1\\"}"}</tool_call>'
            '<tool_call>{"name": calc}</tool_call>'
            '<tool_call>["calc"]</tool_call>'
            '<tool_call>{"name": "calc", "arg')
    calls = HermesParser().parse(text, TOOLS)
    assert [(c.name, c.arguments) for c in calls[:2]] == [("calc", {"expr": "2*3"}), ("calc", {"expr": "1+1"})]
    assert not calls[0].error and not calls[1].error
    assert "not valid JSON" in calls[2].error
    assert '{"name": <string>' in calls[3].error
    assert "unclosed <tool_call>" in calls[4].error
    assert HermesParser().stop_strings(TOOLS) == ["</tool_call>"]


def test_hermes_observation_is_the_templates_delta(chat_tok):
    """The observation is what the template renders after the assistant turn: its closing
    (less the EOS the turn generated), the tool messages, and the next assistant header."""
    tools = [{"role": "tool", "content": "6"}, {"role": "tool", "content": "7"}]
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "X"}]
    full = chat_tok.apply_chat_template(conv + tools, tokenize=False, add_generation_prompt=True)
    base = chat_tok.apply_chat_template(conv, tokenize=False)
    after_eos = HermesParser().observation_ids(chat_tok, tools, "X<|im_end|>")
    assert chat_tok.decode(after_eos) == "\n" + full[len(base):]
    after_stop = HermesParser().observation_ids(chat_tok, tools, "<tool_call>{}</tool_call>")
    assert chat_tok.decode(after_stop) == "<|im_end|>\n" + full[len(base):]
    im_start = chat_tok.convert_tokens_to_ids("<|im_start|>")
    assert im_start in after_eos  # special tokens in the rendered text are encoded as themselves


def test_unknown_parser_names_the_choices():
    with pytest.raises(ValueError, match="parsers: tag, hermes"):
        get_parser("json")
