"""The whole RL pipeline with the real Qwen2 vocabulary: GSM8K-style rows converted into veRL's
schema (`reinforge data gsm8k`), chat-templated by the real template, the dry run's length
report, and a GRPO step through the CLI on a 2-layer Qwen2.5-architecture model."""
from __future__ import annotations

import json
import statistics

import pytest

from reinforge.cli.main import main
from reinforge.data.io import load_rows

pytestmark = pytest.mark.usefixtures("one_thread")
RAW = [("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?", "48 + 24 = 72\n#### 72"),
       ("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
        "How much did she earn?", "12 / 60 * 50 = 10\n#### 10"),
       ("What is 6 times 7?", "6 * 7 = 42\n#### 42"),
       ("Betty has 3 books and buys 1,200 more. How many books does she have now?", "#### 1,203")]


def text_length(prompt: str, response: str, ground_truth, **extra) -> float:
    """A graded reward (a random model over 152k ids almost never writes a digit, so GSM8K's
    math_verify scores 0 and the advantages would all be 0): the response's characters / 100."""
    return len(response) / 100


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory, real_tok) -> dict:
    """veRL-schema parquet files of the rows above (reinforge data gsm8k) and the real prompt
    lengths: each prompt rendered by the template with add_generation_prompt, encoded without
    special tokens, as reinforge/data/text.py does."""
    out = tmp_path_factory.mktemp("gsm8k")
    raw = out / "raw.jsonl"
    raw.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in RAW))
    assert main(["data", "gsm8k", str(raw), str(out / "train.parquet")]) == 0
    rows = load_rows(str(out / "train.parquet"))
    assert rows[3]["reward_model"] == {"style": "rule", "ground_truth": "1203"} and rows[0]["data_source"] == "openai/gsm8k"
    tok = real_tok("qwen2.5-0.5b")
    texts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in rows]
    return {"train": str(out / "train.parquet"), "lengths": [len(x) for x in tok(texts, add_special_tokens=False)["input_ids"]],
            "texts": texts}


def _overrides(model_dir: str, data: dict, run_dir: str, **extra) -> list[str]:
    base = {"model.path": model_dir, "data.train_files": f"[{data['train']}]", "data.max_prompt_length": 80,
            "rollout.max_response_length": 8, "data.train_batch_size": 2, "rollout.n": 4, "trainer.total_steps": 1,
            "trainer.run_dir": run_dir, "reward.functions": f"[{{name: auto}}, {{name: '{__file__}:text_length'}}]",
            "trainer.progress": False, "trainer.loggers": "[jsonl]", "actor.micro_batch_size": 8, "actor.lr": 1e-3,
            "trainer.report": False, "trainer.save_every": 0}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def test_dry_run_reports_the_real_prompt_lengths(real_qwen_dir, gsm8k, tmp_path, capsys, no_model_loads):
    lengths = gsm8k["lengths"]
    assert all("<|im_start|>assistant\n" in t and t.startswith("<|im_start|>system\n") for t in gsm8k["texts"])
    limit = sorted(lengths)[-1] - 1  # the longest prompt is one token too long
    argv = ["train", "--config", "grpo", *_overrides(real_qwen_dir, gsm8k, str(tmp_path / "run"),
                                                     **{"data.max_prompt_length": limit,
                                                        "data.overlong_prompt": "skip"}), "--dry-run"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "tokenizer: Qwen2Tokenizer, 151936 tokens; stops at <|endoftext|>, <|im_end|>" in out, out
    kept = [n for n in lengths if n <= limit]
    assert f"data.train_files: {len(kept)} prompts, 1 skipped (longer than data.max_prompt_length={limit})" in out
    assert (f"prompt tokens: {min(kept)} min, {statistics.median(kept):g} median, {max(kept)} max "
            f"(data.max_prompt_length={limit})") in out, out
    assert not (tmp_path / "run").exists()


def test_grpo_on_chat_templated_gsm8k_with_the_real_vocabulary(real_qwen_dir, gsm8k, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--config", "grpo", *_overrides(real_qwen_dir, gsm8k, str(run))]) == 0
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if s["step"] > 0]
    assert len(steps) == 1 and steps[0]["actor/grad_norm"] > 0 and steps[0]["response_length/mean"] <= 8
    assert steps[0]["reward/auto/mean"] == 0.0 and "actor/kl_loss" in steps[0]  # math_verify ran, the reference too
    samples = [json.loads(x) for f in sorted((run / "samples").glob("*step_*.jsonl")) for x in f.read_text().splitlines()]
    assert samples and all(s["prompt"] in gsm8k["texts"] for s in samples), samples[0]
    assert (run / "hf" / "tokenizer.json").is_file() and (run / "hf" / "chat_template.jinja").is_file()
