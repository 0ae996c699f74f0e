"""SFT rows in TRL's schemas: prompt/completion (text and conversational) and multi-turn
`messages` with loss on every assistant turn, checked on a Qwen2-style ChatML template by
decoding the tokens that get loss."""
from __future__ import annotations

import pytest

from reinforge.data import DataError, SFTDataset
from reinforge.tasks import build_char_tokenizer
from tests.data.conftest import write_jsonl

# Qwen2-Instruct's template, tools left out: a default system turn, then <|im_start|>role\n...<|im_end|>\n.
CHATML = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"}, {"role": "user", "content": "and 2+2?"},
        {"role": "assistant", "content": "4, as 2*2."}]


@pytest.fixture(scope="module")
def chatml():
    """The character tokenizer with ChatML's special tokens; EOS is <|im_end|>, as in Qwen2-Instruct."""
    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = CHATML
    return tok


def runs(tok, item, target: int) -> list[str]:
    """The decoded stretches of consecutive tokens whose loss_mask equals `target`."""
    out, cur = [], []
    for t, m in zip(item["input_ids"] + [None], item["loss_mask"] + [None]):
        if m == target:
            cur.append(t)
        elif cur:
            out.append(tok.decode(cur))
            cur = []
    return out


def test_messages_loss_on_every_assistant_turn(tmp_path, chatml):
    item = SFTDataset(write_jsonl(tmp_path / "m.jsonl", [{"messages": CHAT}]), chatml, max_length=200)[0]
    assert runs(chatml, item, 1) == ["2<|im_end|>", "4, as 2*2.<|im_end|>"]
    assert runs(chatml, item, 0) == [
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n",
        "\n<|im_start|>user\nand 2+2?<|im_end|>\n<|im_start|>assistant\n"]
    # The whole sequence is the template's rendering, up to the last end of turn.
    full = chatml.apply_chat_template(CHAT, tokenize=False)
    assert chatml.decode(item["input_ids"]) == full.removesuffix("\n")
    assert item["input_ids"][-1] == chatml.eos_token_id


def test_conversational_prompt_completion(tmp_path, chatml):
    rows = [{"prompt": CHAT[:4], "completion": CHAT[4:]},
            {"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", "content": "yo"}]}]
    ds = SFTDataset(write_jsonl(tmp_path / "c.jsonl", rows), chatml, max_length=200)
    # The assistant turn inside the prompt is context: only the completion is learnt.
    assert runs(chatml, ds[0], 1) == ["4, as 2*2.<|im_end|>"]
    assert runs(chatml, ds[1], 1) == ["yo<|im_end|>"]
    assert runs(chatml, ds[1], 0) == ["<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                                      "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"]


def test_standard_prompt_completion_and_legacy_rows(tmp_path):
    """Text prompt/completion is prompt/response under TRL's names; old files load as before."""
    tok = build_char_tokenizer()
    ds = SFTDataset(write_jsonl(tmp_path / "s.jsonl", [{"prompt": "12+3=", "completion": "15"}]), tok, max_length=16)
    eos = tok.eos_token_id
    assert ds[0] == {"input_ids": tok("12+3=15")["input_ids"] + [eos], "loss_mask": [0] * 5 + [1, 1, 1]}
    # The character tokenizer's template concatenates contents and has no end of turn: each
    # assistant content is a target, and the EOS the model learns to stop with closes the row.
    multi = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
             {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    item = SFTDataset(write_jsonl(tmp_path / "m.jsonl", [{"messages": multi}]), tok, max_length=16)[0]
    assert item == {"input_ids": tok("abcd")["input_ids"] + [eos], "loss_mask": [0, 1, 0, 1, 1]}


@pytest.mark.parametrize("row,field,msg", [
    ({"prompt": "1+1=", "completion": [{"role": "assistant", "content": "2"}]}, "prompt",
     "the completion is a message list, so the prompt must be one too"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "messages", "no assistant message to train on"),
    ({"messages": CHAT[:2] + [{"role": "assistant", "content": " "}]}, "messages", "message 2 \\(assistant\\) is empty"),
    ({"prompt": "1=", "completion": ""}, "completion", "empty response"),
])
def test_schema_errors(tmp_path, chatml, row, field, msg):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "1=", "completion": "1"}, row])
    with pytest.raises(DataError, match=rf"bad\.jsonl: row 1: field '{field}': {msg}"):
        SFTDataset(path, chatml, max_length=200)


def test_template_that_rewrites_history_is_refused(tmp_path):
    """A template that drops earlier assistant turns (as reasoning templates drop past thinking)
    cannot be split into turns: one error, not silently wrong masks."""
    tok = build_char_tokenizer()
    tok.chat_template = ("{% for m in messages %}{% if loop.last or m['role'] != 'assistant' %}"
                         "{{ m['content'] }}{% endif %}{% endfor %}")
    with pytest.raises(DataError, match=r"row 0: field 'messages': the chat template does not render message 3"):
        SFTDataset(write_jsonl(tmp_path / "r.jsonl", [{"messages": CHAT[1:]}]), tok, max_length=200)
