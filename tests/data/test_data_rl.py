"""RLDataset schemas, row validation, overlong policies; PromptLoader determinism and resume."""

import json

import pytest

from reinforge.data import DataError, PromptLoader, RLDataset, load_rows, write_rows
from reinforge.tasks import build_char_tokenizer
from tests.data.conftest import write_jsonl


def test_verl_parquet_schema(tmp_path, tok):
    rows = [
        {"data_source": "gsm8k", "prompt": [{"role": "user", "content": "1+1="}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": {"split": "train", "index": 0}},
        {"data_source": "gsm8k", "prompt": [{"role": "user", "content": "2+2="}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"split": "train", "index": 1}},
    ]
    ds = RLDataset(write_rows(rows, tmp_path / "train.parquet"), tok, max_prompt_length=16)
    item = ds[1]
    assert len(ds) == 2 and item["prompt_text"] == "2+2=" and item["prompt_ids"] == tok("2+2=")["input_ids"]
    assert item["ground_truth"] == "4" and item["data_source"] == "gsm8k"
    assert item["extra"]["extra_info"] == {"split": "train", "index": 1} and item["extra"]["ability"] == "math"
    assert "reward_model" not in item["extra"] and "prompt" not in item["extra"]


def test_trl_jsonl_text_prompt_and_answer_column(tmp_path, tok):
    path = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "3+4=", "answer": "7", "level": 2}])
    item = RLDataset(path, tok, max_prompt_length=8)[0]
    assert item["prompt_text"] == "3+4=" and item["ground_truth"] == "7"
    assert item["extra"] == {"level": 2, "data_source": "t"}  # file stem when no data_source column


def test_messages_prompt_uses_chat_template(tmp_path, tok):
    tok2 = build_char_tokenizer()
    tok2.chat_template = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    path = write_jsonl(tmp_path / "m.jsonl", [{"prompt": [{"role": "user", "content": "hi"}], "solution": "x"}])
    assert RLDataset(path, tok2, max_prompt_length=32)[0]["prompt_text"] == "[user]hi>"


@pytest.mark.parametrize(
    "row,field,msg",
    [
        ({"answer": "1"}, "prompt", "missing"),
        ({"prompt": "   ", "answer": "1"}, "prompt", "empty"),
        ({"prompt": 5, "answer": "1"}, "prompt", "expected a string"),
        ({"prompt": [{"role": "user"}], "answer": "1"}, "prompt", "message 0"),
        ({"prompt": "1+1="}, "ground_truth", "missing"),
        ({"prompt": "1+1=", "reward_model": {"style": "rule"}}, "reward_model.ground_truth", "missing"),
    ],
)
def test_malformed_row_names_file_row_field(tmp_path, tok, row, field, msg):
    good = {"prompt": "1+1=", "answer": "2"}
    path = write_jsonl(tmp_path / "bad.jsonl", [good, good, row])
    with pytest.raises(DataError, match=rf"bad\.jsonl: row 2: field '{field}': .*{msg}"):
        RLDataset(path, tok, max_prompt_length=8)


def test_ground_truth_optional(tmp_path, tok):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hello"}])
    assert RLDataset(path, tok, max_prompt_length=8, require_ground_truth=False)[0]["ground_truth"] is None


def test_load_rows_errors(tmp_path):
    with pytest.raises(DataError, match="nothere.parquet"):
        load_rows(tmp_path / "nothere.parquet")
    (tmp_path / "x.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match="x.parquet"):
        load_rows(tmp_path / "x.parquet")
    (tmp_path / "y.jsonl").write_text('{"a": 1}\n{oops\n')
    with pytest.raises(DataError, match="y.jsonl: line 2"):
        load_rows(tmp_path / "y.jsonl")
    (tmp_path / "z.json").write_text('[{"a": 1}, {"a": 2}]')
    assert load_rows(tmp_path / "z.json") == [{"a": 1}, {"a": 2}]
    (tmp_path / "e.jsonl").write_text("\n")
    assert load_rows(tmp_path / "e.jsonl") == []
    with pytest.raises(DataError, match=r"^e\.jsonl: no rows$"):
        load_rows(tmp_path / "e.jsonl", nonempty=True)


def test_overlong_policies(tmp_path, tok):
    path = write_jsonl(tmp_path / "o.jsonl", [{"prompt": "1+1=", "answer": "2"},
                                              {"prompt": "123456789+1=", "answer": "x"}])
    with pytest.raises(DataError, match=r"o\.jsonl: row 1: field 'prompt': prompt has 12 tokens > data\.max_prompt_length=6"):
        RLDataset(path, tok, max_prompt_length=6)
    with pytest.raises(DataError, match=r"> eval\.max_prompt_length=6 \(raise it\)"):  # SFT/DPO eval prompts
        RLDataset(path, tok, max_prompt_length=6, length_key="eval.max_prompt_length")
    skipped = RLDataset(path, tok, max_prompt_length=6, overlong_prompt="skip")
    assert len(skipped) == 1 and skipped.num_skipped == 1
    cut = RLDataset(path, tok, max_prompt_length=6, overlong_prompt="truncate_left")
    assert cut[1]["prompt_text"] == "789+1=" and len(cut[1]["prompt_ids"]) == 6 and cut[1]["index"] == 1


def _dataset(tmp_path, tok, n):
    return RLDataset(write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"{i}=", "answer": str(i)} for i in range(n)]),
                     tok, max_prompt_length=8)


def _ids(batch):
    return [it["ground_truth"] for it in batch]


def test_loader_deterministic_epochs_and_resume(tmp_path, tok):
    ds = _dataset(tmp_path, tok, 10)
    a, b = PromptLoader(ds, 3, seed=7), PromptLoader(ds, 3, seed=7)
    run = [_ids(next(a)) for _ in range(8)]
    assert run == [_ids(next(b)) for _ in range(8)]
    assert len(a) == 3 and len(set(sum(run[:3], []))) == 9  # drop_last: 3 full batches per epoch, no repeats
    assert run[:3] != run[3:6]  # reshuffled per epoch
    assert run != [_ids(x) for x, _ in zip(PromptLoader(ds, 3, seed=8), range(8))]

    c = PromptLoader(ds, 3, seed=7)
    head = [_ids(next(c)) for _ in range(4)]  # stop mid-epoch 1
    state = json.loads(json.dumps(c.state_dict()))  # survives a JSON checkpoint
    assert state["epoch"] == 1 and state["position"] == 3
    d = PromptLoader(ds, 3, seed=7)
    d.load_state_dict(state)
    assert head + [_ids(next(d)) for _ in range(4)] == run
    with pytest.raises(ValueError, match="seed"):
        PromptLoader(ds, 3, seed=1).load_state_dict(state)


def test_loader_keep_last(tmp_path, tok):
    loader = PromptLoader(_dataset(tmp_path, tok, 5), 2, seed=0, drop_last=False)
    sizes = [len(next(loader)) for _ in range(6)]
    assert sizes == [2, 2, 1, 2, 2, 1] and len(loader) == 3
