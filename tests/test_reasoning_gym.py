"""reasoning-gym as data and reward (issue 35): `reinforge data reasoning-gym`, the `reasoning_gym`
reward (the task's own scorer on the extracted answer), its extraction rule and its errors."""
import json
import sys

import pyarrow.parquet as pq
import pytest

from reinforge.cli.main import main
from reinforge.data.io import DataError
from reinforge.data.reasoning_gym import INSTALL_HINT, build_dataset, make_reasoning_gym_data
from reinforge.rewards.reasoning_gym import extract_answer, reasoning_gym_reward
from tests.conftest import rl_overrides

rg = pytest.importorskip("reasoning_gym")

# Tasks with numeric, expression (countdown) and word-problem (gsm_symbolic) answers.
TASKS = {
    "chain_sum": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2},
    "basic_arithmetic": {},
    "countdown": {},
    "gsm_symbolic": {},
    "letter_counting": {},
}


def _rows(path: str) -> list[dict]:
    return pq.read_table(path).to_pylist()


@pytest.fixture(scope="module")
def task_files(tmp_path_factory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("rg")
    return {name: make_reasoning_gym_data(name, str(root / name), n_train=6, n_test=4, seed=7, options=opts)
            for name, opts in TASKS.items()}


@pytest.mark.parametrize(
    "reply,truth,expected",
    [
        ("so 3 + 4 = 7 <answer> 7 </answer>", "7", "7"),
        ("<answer>1</answer> no, <answer>2</answer>", "2", "2"),  # the last tag wins
        ("<answer>\nline one\nline two\n</answer>", "x", "line one\nline two"),
        ("<answer></answer>", "7", ""),  # an empty tag is an empty answer, not a fallback
        ("3 + 4 is 7, minus 10 is -3", "-3", "-3"),  # numeric truth: the last number
        ("the total is 1,024.", "1024", "1024"),
        ("half: 2.5", "2.5", "2.5"),
        ("<answer>7 is unclosed", "7", "7"),  # no closed tag: numeric fallback
        ("no numbers here", "12", "no numbers here"),  # numeric truth, no number: the whole reply
        ("  cat dog  ", "dog cat", "cat dog"),  # text truth: the whole reply, stripped
        ("", "7", None),
        ("   \n ", "7", None),
    ],
)
def test_extraction_rule(reply, truth, expected):
    assert extract_answer(reply, truth) == expected


def _replies(gold: str) -> list[str]:
    return [f"Let me think.\n<answer>{gold}</answer>", f"<answer>{gold}</answer><answer>0</answer>", "<answer>",
            "", "The answer is 12345", gold, "<answer>nonsense (</answer>"]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_reward_equals_the_tasks_own_score_on_the_original_entry(task_files, name):
    """The stored rows rebuild an entry that scores exactly as the generated one, through the reward."""
    ds = rg.create_dataset(name, seed=7, size=10, **TASKS[name])
    checked = 0
    for split in ("train", "test"):
        for row in _rows(task_files[name][split]):
            info, gt = row["extra_info"], row["reward_model"]["ground_truth"]
            original = ds[info["rg_index"]]
            assert gt == str(original["answer"]) and row["prompt"][-1]["content"].startswith(original["question"])
            for reply in _replies(gt):
                got = reasoning_gym_reward("p", reply, gt, extra_info=info)
                want = ds.score_answer(answer=extract_answer(reply, gt), entry=original)
                assert got["score"] == pytest.approx(want) and got["acc"] == (want >= 1 - 1e-6), (reply, got, want)
                checked += 1
            right = reasoning_gym_reward("p", f"<answer>{gt}</answer>", gt, extra_info=info)
            assert right == {"score": 1.0, "acc": True}
    assert checked == 10 * len(_replies("x"))


def test_data_files_schema_and_disjoint_splits(tmp_path, capsys):
    out = tmp_path / "cs"
    # two-term sums of one digit: ~200 distinct questions, so train meets test questions and skips them
    argv = ["data", "reasoning-gym", "chain_sum", "min_terms=2", "max_terms=2", "max_digits=1", "--n-train", "60",
            "--n-test", "40", "--seed", "3", "--out", str(out), "--system", "Be brief."]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    train, test = _rows(str(out / "train.parquet")), _rows(str(out / "test.parquet"))
    meta = json.loads((out / "reasoning_gym.json").read_text())
    # test first: the first 40 entries, every one kept; train: the next entries not asking a test question
    assert len(test) == 40 and [r["extra_info"]["rg_index"] for r in test] == list(range(40))
    assert [r["extra_info"]["index"] for r in test] == list(range(40))
    question = lambda r: json.loads(r["extra_info"]["rg_entry"])["question"]  # noqa: E731
    assert not {question(r) for r in train} & {question(r) for r in test}
    ds = build_dataset("chain_sum", {"min_terms": 2, "max_terms": 2, "max_digits": 1}, seed=3, size=400)
    held = {ds[i]["question"] for i in range(40)}
    want = [i for i in range(40, 400) if ds[i]["question"] not in held][:60]
    assert [r["extra_info"]["rg_index"] for r in train] == want and len(train) == 60
    assert meta["train_skipped_in_test"] == want[-1] + 1 - 100 > 0 and meta["n_test"] == 40
    assert f"({meta['train_skipped_in_test']} entries asking a test question skipped)" in printed
    row = train[0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    assert row["data_source"] == "reasoning_gym/chain_sum" and row["reward_model"]["style"] == "rule"
    assert row["prompt"][0] == {"role": "system", "content": "Be brief."}
    assert row["prompt"][1]["role"] == "user" and row["prompt"][1]["content"].endswith(
        "\nPut your final answer in <answer></answer>.")
    info = row["extra_info"]
    assert (info["rg_task"], info["rg_seed"], info["split"]) == ("chain_sum", 3, "train")
    assert json.loads(info["rg_options"]) == {"min_terms": 2, "max_terms": 2, "max_digits": 1}
    sft = _rows(str(out / "sft.parquet"))  # the train prompts answered with the gold, as chat rows
    assert len(sft) == 60 and [dict(m) for m in sft[0]["messages"]] == [
        *map(dict, row["prompt"]), {"role": "assistant", "content": f"<answer>{row['reward_model']['ground_truth']}</answer>"}]
    assert f"sft: {out / 'sft.parquet'}" in printed
    # the same seed writes the same rows
    again = make_reasoning_gym_data("chain_sum", str(tmp_path / "again"), n_train=60, n_test=40, seed=3,
                                    system="Be brief.", options={"min_terms": 2, "max_terms": 2, "max_digits": 1})
    assert _rows(again["train"]) == train and _rows(again["test"]) == test


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["chain_summ"], "reasoning-gym has no task 'chain_summ'; close: chain_sum, decimal_chain_sum; list all"),
        (["chain_sum", "min_term=2"], "task 'chain_sum' has no option 'min_term'; did you mean 'min_terms'? options: "),
        (["chain_sum", "min_terms=5", "max_terms=2"], "refused options {'min_terms': 5, 'max_terms': 2}: "
                                                      "max_terms must be >= min_terms"),
        (["chain_sum", "seed=1"], "option 'seed' is set by reinforge"),
        (["arc_agi", "--n-train", "2", "--n-test", "1"], "metadata does not survive JSON storage"),
        ([], "needs a task and --out"),
    ],
    ids=["unknown_task", "unknown_option", "refused_value", "reserved_option", "unstorable_task", "no_task"],
)
def test_bad_input_one_line(argv, needle, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["data", "reasoning-gym", *argv, *(["--out", str(out)] if argv else [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reinforge: error: ") and needle in err[0], err
    assert not out.exists()


def test_missing_extra_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` raises ImportError
    assert main(["data", "reasoning-gym", "chain_sum", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"reinforge: error: reasoning-gym is not installed: {INSTALL_HINT}"]


def test_missing_extra_is_refused_before_training(monkeypatch, task_files):
    from reinforge.trainers.preflight import check_reward_rows

    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(DataError, match=r"^reasoning-gym is not installed: pip install 'reinforge\[reasoning\]'$"):
        check_reward_rows([("reward.functions[0].name", "reasoning_gym", None)], [task_files["chain_sum"]["train"]])


def test_rows_without_the_entry_are_refused_with_file_and_row(tmp_path, arith_data):
    from reinforge.trainers.preflight import check_reward_rows

    with pytest.raises(DataError, match=r"^train\.parquet: row 0: field 'extra_info\.rg_task': missing"):
        check_reward_rows([("reward.functions[0].name", "reasoning_gym", None)], [arith_data["train"]])
    with pytest.raises(DataError, match="row 0: field 'extra_info': missing"):
        reasoning_gym_reward("p", "1", "1", extra_info=None)
    check_reward_rows([("k", "exact_match", None)], [arith_data["train"]])  # other rewards: no row check
    from reinforge.rewards.reasoning_gym import check_rows

    info = {"rg_task": "chain_sums", "rg_options": "{}", "rg_entry": "{}"}
    with pytest.raises(DataError, match=r"^x\.jsonl: row 1: field 'extra_info\.rg_task': reasoning-gym has no task"):
        check_rows([{"extra_info": {**info, "rg_task": "chain_sum"}}, {"extra_info": info}], "x.jsonl")


def test_rows_handed_over_in_python_are_checked_too(tiny_model_dir, tmp_path, no_model_loads):
    from reinforge import RLConfig, RLTrainer

    cfg = RLConfig.from_preset("grpo", **{"model.path": tiny_model_dir, "trainer.run_dir": str(tmp_path / "run"),
                                          "data.max_prompt_length": 8, "rollout.max_response_length": 4})
    rows = [{"prompt": "1+1=", "ground_truth": "2", "extra_info": {"rg_task": "chain_sum"}}]
    with pytest.raises(DataError, match=r"^python:train_dataset: row 0: field 'extra_info\.rg_options': missing"):
        RLTrainer(cfg, reward_funcs=["reasoning_gym"], train_dataset=rows)
    assert not (tmp_path / "run").exists()


def test_through_the_dataset_and_the_reward_manager(task_files):
    """Rows read by RLDataset hand their extra_info to the reward; `acc` reaches the correctness rule,
    in a reward worker process, and `auto` dispatches reasoning_gym/<task> rows to the same scorer."""
    from reinforge.data.rl_dataset import RLDataset
    from reinforge.rewards.manager import RewardManager
    from reinforge.rewards.registry import auto_reward
    from reinforge.tasks import build_char_tokenizer

    items = list(RLDataset(task_files["chain_sum"]["test"], build_char_tokenizer(), max_prompt_length=512))
    replies = [f"<answer>{it['ground_truth']}</answer>" if i % 2 == 0 else "<answer>x</answer>"
               for i, it in enumerate(items)]
    with RewardManager(["reasoning_gym"], num_workers=1, timeout_s=60) as manager:
        out = manager.score([it["prompt_text"] for it in items], replies, [it["ground_truth"] for it in items],
                            [it["extra"] for it in items])
    assert out.scores == [1.0 if i % 2 == 0 else 0.0 for i in range(len(items))]
    assert out.reported_correct == [i % 2 == 0 for i in range(len(items))]
    it = items[0]
    assert auto_reward(it["prompt_text"], replies[0], it["ground_truth"], **it["extra"]) == 1.0


@pytest.mark.slow
def test_eval_cli_with_the_reasoning_gym_reward(tiny_model_dir, task_files, capsys):
    """The wiring end to end on the tiny character model: it cannot solve anything, but eval runs,
    scores every sample through the task's scorer and reports per-task accuracy."""
    rc = main(["eval", "--model", tiny_model_dir, "--data", task_files["chain_sum"]["test"], "--reward",
               "reasoning_gym", "--n", "2", "--max-samples", "4", "--max-prompt-length", "200",
               "--max-response-length", "8"])
    assert rc == 0
    metrics = json.loads(capsys.readouterr().out)
    assert 0.0 <= metrics["val/acc_greedy"] <= 1.0 and 0.0 <= metrics["val/score_greedy"] <= 1.0
    assert "val/reasoning_gym/chain_sum/acc_greedy" in metrics and "val/pass@2" in metrics


@pytest.mark.slow
def test_one_grpo_step_with_the_reasoning_gym_reward(tiny_model_dir, task_files, tmp_path):
    """`reward.functions=[{name: reasoning_gym}]` in a training run: rows, reward worker, metrics."""
    data = {"train": task_files["chain_sum"]["train"], "test": task_files["chain_sum"]["test"]}
    run = tmp_path / "run"
    argv = ["train", "--config", "grpo", *rl_overrides(tiny_model_dir, data, str(run)), "trainer.total_steps=1",
            "reward.functions=[{name: reasoning_gym}]", "data.max_prompt_length=160", "trainer.device=cpu"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if r.get("step") == 1 and "reward/reasoning_gym/mean" in r)
    assert 0.0 <= step["reward/reasoning_gym/mean"] <= 1.0


@pytest.mark.slow
def test_eval_cli_greedy_only(tiny_model_dir, task_files, capsys):
    """`--n 0`: the greedy pass alone (no sampled metrics), as the greedy pass of `--n 2` scores it."""
    argv = ["eval", "--model", tiny_model_dir, "--data", task_files["chain_sum"]["test"], "--reward", "reasoning_gym",
            "--max-samples", "4", "--max-prompt-length", "200", "--max-response-length", "8"]
    assert main([*argv, "--n", "0"]) == 0
    greedy = json.loads(capsys.readouterr().out)
    assert "val/acc_sampled" not in greedy and not any(k.startswith("val/pass@") for k in greedy)
    assert main([*argv, "--n", "2"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert greedy["val/acc_greedy"] == both["val/acc_greedy"]
    assert greedy["val/response_length_greedy"] == both["val/response_length_greedy"]


def test_train_cannot_be_filled_outside_the_test_set_is_refused(tmp_path):
    # two-term sums of one digit have ~200 distinct questions: 2000 test entries hold all of them
    with pytest.raises(DataError, match=r"too few distinct questions.*lower --n-test"):
        make_reasoning_gym_data("chain_sum", str(tmp_path), n_train=10, n_test=2000, seed=0,
                                options={"min_terms": 2, "max_terms": 2, "max_digits": 1})
    assert not list(tmp_path.iterdir())  # nothing written
