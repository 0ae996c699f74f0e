"""SFT loss masks and collation; preference-pair validation; GSM8K / MATH preprocessing."""

import pytest

from reinforge.data import (DataError, PreferenceDataset, RLDataset, SFTDataset, collate_preference, collate_sft,
                            load_rows, preprocess_gsm8k, preprocess_math)
from reinforge.tasks import build_char_tokenizer
from tests.data.conftest import write_jsonl


def test_sft_loss_mask_and_collate(tmp_path, tok):
    path = write_jsonl(tmp_path / "s.jsonl", [
        {"prompt": "12+3=", "response": "15"},
        {"messages": [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]},
    ])
    ds = SFTDataset(path, tok, max_length=16)
    eos = tok.eos_token_id
    a, b = ds[0], ds[1]
    assert a["input_ids"] == tok("12+3=15")["input_ids"] + [eos]
    assert a["loss_mask"] == [0] * 5 + [1, 1, 1]  # response "15" and the eos
    assert b["loss_mask"] == [0] * 4 + [1, 1]
    batch = collate_sft([a, b], pad_id=tok.pad_token_id)
    assert batch["input_ids"].shape == (2, 8)
    assert batch["attention_mask"][1].tolist() == [1] * 6 + [0, 0]  # right padding
    assert batch["input_ids"][1, 6:].tolist() == [tok.pad_token_id] * 2
    assert batch["loss_mask"][1].tolist() == [0] * 4 + [1, 1, 0, 0]


def test_sft_errors_and_overlong(tmp_path, tok):
    bad = write_jsonl(tmp_path / "s.jsonl", [{"prompt": "1=", "response": "1"}, {"prompt": "2="}])
    with pytest.raises(DataError, match=r"s\.jsonl: row 1: field 'response': missing"):
        SFTDataset(bad, tok, max_length=16)
    long = write_jsonl(tmp_path / "l.jsonl", [{"prompt": "1=", "response": "1"},
                                              {"prompt": "2=", "response": "2" * 20}])
    with pytest.raises(DataError, match=r"l\.jsonl: row 1: .*23 tokens > data\.max_length=10"):
        SFTDataset(long, tok, max_length=10)
    assert SFTDataset(long, tok, max_length=10, overlong="skip").num_skipped == 1
    cut = SFTDataset(long, tok, max_length=10, overlong="truncate_right")
    assert len(cut[1]["input_ids"]) == 10 and sum(cut[1]["loss_mask"]) == 8


def test_preferences(tmp_path, tok):
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "1+1=", "chosen": "2", "rejected": "3"},
        {"prompt": [{"role": "user", "content": "2+2="}], "chosen": [{"role": "assistant", "content": "4"}],
         "rejected": [{"role": "assistant", "content": "5"}]},
    ])
    ds = PreferenceDataset(path, tok, max_length=16)
    eos = tok.eos_token_id
    assert ds[1]["prompt_ids"] == tok("2+2=")["input_ids"] and ds[1]["chosen_ids"] == tok("4")["input_ids"] + [eos]
    batch = collate_preference([ds[0], ds[1]], pad_id=tok.pad_token_id)
    assert batch["input_ids"].shape == (4, 6)  # chosen rows 0..1, rejected rows 2..3
    assert batch["input_ids"][2].tolist() == tok("1+1=3")["input_ids"] + [eos]
    assert batch["loss_mask"][0].tolist() == [0, 0, 0, 0, 1, 1]
    # The same batch as SFT collation of the chosen rows followed by the rejected rows.
    rows = [{"input_ids": it["prompt_ids"] + it[k], "loss_mask": [0] * len(it["prompt_ids"]) + [1] * len(it[k])}
            for k in ("chosen_ids", "rejected_ids") for it in (ds[0], ds[1])]
    sft = collate_sft(rows, pad_id=tok.pad_token_id)
    assert sorted(batch) == sorted(sft) and all(batch[k].tolist() == sft[k].tolist() for k in sft)


@pytest.mark.parametrize(
    "row,field,msg",
    [
        ({"prompt": "1=", "chosen": "a", "rejected": "a"}, "rejected", "identical"),
        ({"prompt": "1=", "chosen": " ", "rejected": "a"}, "chosen", "empty"),
        ({"prompt": "1=", "chosen": "a"}, "rejected", "missing"),
        ({"chosen": "a", "rejected": "b"}, "prompt", "missing"),
    ],
)
def test_preference_validation(tmp_path, tok, row, field, msg):
    path = write_jsonl(tmp_path / "prefs.jsonl", [{"prompt": "1=", "chosen": "1", "rejected": "2"}, row])
    with pytest.raises(DataError, match=rf"prefs\.jsonl: row 1: field '{field}': .*{msg}"):
        PreferenceDataset(path, tok, max_length=16)


def test_preprocess_gsm8k_and_math(tmp_path, tok):
    raw = write_jsonl(tmp_path / "gsm.jsonl", [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=7\n#### 7"},
        {"question": "Big?", "answer": "so\n#### 1,234"},
    ])
    out = preprocess_gsm8k(raw, tmp_path / "train.parquet")
    rows = load_rows(out)
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["7", "1234"]
    assert rows[0]["prompt"][0]["role"] == "user" and rows[0]["prompt"][0]["content"].startswith("Tom has")
    assert rows[0]["extra_info"]["split"] == "train" and rows[0]["data_source"] == "openai/gsm8k"
    tok_chat = build_char_tokenizer()
    assert RLDataset(out, tok_chat, max_prompt_length=200)[1]["ground_truth"] == "1234"

    raw = write_jsonl(tmp_path / "math.jsonl", [
        {"problem": "Half?", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "level": "Level 1"},
        {"problem": "Sq?", "solution": "First \\boxed{1}, finally \\boxed{x^{2}+\\sqrt{3}}"},
    ])
    rows = load_rows(preprocess_math(raw, tmp_path / "test.jsonl"))
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["\\frac{1}{2}", "x^{2}+\\sqrt{3}"]
    assert rows[0]["extra_info"]["level"] == "Level 1"

    bad = write_jsonl(tmp_path / "badmath.jsonl", [{"problem": "p", "solution": "\\boxed{1"}])
    with pytest.raises(DataError, match=r"badmath\.jsonl: row 0: field 'solution'"):
        preprocess_math(bad, tmp_path / "o.parquet")
    bad = write_jsonl(tmp_path / "badgsm.jsonl", [{"question": "q", "answer": "no marker"}])
    with pytest.raises(DataError, match=r"badgsm\.jsonl: row 0: field 'answer'"):
        preprocess_gsm8k(bad, tmp_path / "o.parquet")
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    for fn in (preprocess_gsm8k, preprocess_math):  # the file's name, as every other "no rows" error
        with pytest.raises(DataError, match=r"^empty\.jsonl: no rows$"):
            fn(empty, tmp_path / "o.parquet")


@pytest.mark.parametrize("make", [
    lambda p, t: SFTDataset(p, t, max_length=8),
    lambda p, t: PreferenceDataset(p, t, max_length=8),
    lambda p, t: RLDataset(p, t, max_prompt_length=8),
])
def test_datasets_reject_empty_file(tmp_path, tok, make):
    empty = write_jsonl(tmp_path / "none.jsonl", [])
    with pytest.raises(DataError, match=r"^none\.jsonl: no rows$"):
        make(empty, tok)


def test_sft_and_preferences_need_eos(tmp_path, tok):
    class NoEos:
        eos_token_id = None

    path = write_jsonl(tmp_path / "x.jsonl", [{"prompt": "1=", "response": "1", "chosen": "1", "rejected": "2"}])
    with pytest.raises(ValueError, match="^SFTDataset needs a tokenizer with an eos token$"):
        SFTDataset(path, NoEos(), max_length=8)
    with pytest.raises(ValueError, match="^PreferenceDataset needs a tokenizer with an eos token$"):
        PreferenceDataset(path, NoEos(), max_length=8)
