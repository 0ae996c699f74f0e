"""`reinforge demo --task chain_sum`: SmolLM2-135M-Instruct on reasoning-gym's chain_sum, its
inline reward, and the whole pipeline end to end with --quick (the model cut to 2 layers)."""
from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("reasoning_gym")


def test_inline_reward_scores_as_the_builtin_and_skips_the_pool():
    from reinforge.cli.demo_chain_sum import chain_sum_reward
    from reinforge.data.reasoning_gym import build_dataset, entry_json
    from reinforge.rewards.manager import RewardManager

    entry = build_dataset("chain_sum", {"min_terms": 3, "max_terms": 3, "max_digits": 1}, seed=0, size=1)[0]
    extra = {"rg_task": "chain_sum", "rg_options": json.dumps({"min_terms": 3, "max_terms": 3, "max_digits": 1}),
             "rg_entry": entry_json(entry)}
    right = chain_sum_reward("", f"The answer is {entry['answer']}", entry["answer"], extra)
    wrong = chain_sum_reward("", str(int(entry["answer"]) + 1), entry["answer"], extra)
    assert right == {"score": 1.0, "acc": True} and wrong["acc"] is False and wrong["score"] < 1.0
    manager = RewardManager([{"name": "reinforge.cli.demo_chain_sum:chain_sum_reward"}])
    try:
        assert [f.mode for f in manager.fns] == ["inline"]  # no worker process to start
    finally:
        manager.close()


@pytest.mark.slow
def test_chain_sum_demo_quick_end_to_end(tmp_path, capsys, smollm2_folder):
    from reinforge.cli.main import main

    out = tmp_path / "demo"
    assert main(["demo", "--task", "chain_sum", "--quick", "--seed", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "after SFT" in printed and "after GRPO" in printed and "CPU s" in printed and str(out) in printed
    for f in ("data/train.parquet", "data/test.parquet", "data/sft.parquet", "sft/hf/config.json",
              "grpo/hf/config.json", "demo_report.json"):
        assert (out / f).exists(), f
    report = json.loads((out / "demo_report.json").read_text())
    assert report["seed"] == 1 and report["task"]["data_seed"] == 1 and report["model"] == "smollm2-135m-instruct"
    for stage, keys in (("base", ("acc_greedy", "acc_sampled", "pass@2")), ("sft", ("acc_greedy",)),
                        ("rl", ("acc_greedy", "acc_sampled", "pass@2"))):
        for key in keys:
            assert 0.0 <= report[stage][key] <= 1.0, (stage, key)
    assert math.isfinite(report["delta_acc_greedy"])
    assert report["cpu_s"]["total"] > 0 and set(report["wall_s"]) == set(report["cpu_s"])
    rows = [json.loads(x) for x in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/acc_greedy" in r] == [0, 2]


def test_seeds_draw_different_questions(tmp_path, monkeypatch):
    """reasoning-gym draws entry i from seed + i: the demo spaces its data seeds apart so that
    --seed 0 and --seed 1 do not share their held-out questions (shifted by one row)."""
    from reinforge.cli import demo_chain_sum as demo
    from reinforge.data.io import load_rows

    monkeypatch.setattr("reinforge.models.pretrained.pretrained_folder", lambda name, quiet=True: tmp_path)
    monkeypatch.setattr(demo, "QUICK_TASK", {"n_train": 64, "n_test": 40, "n_eval": 30})
    tests = []
    for seed in (0, 1):
        monkeypatch.setattr("reinforge.models.pretrained.truncated_copy", lambda src, out, layers: src)
        _, paths, task = demo.make_inputs(tmp_path / str(seed), True, seed)
        tests.append({r["prompt"][-1]["content"] for r in load_rows(paths["test"])})
        assert len(load_rows(paths["sft"])) == task["n_train"]
    # 200 two-term and 4,000 three-term questions, about half of the draws two-term: a few by chance
    assert len(tests[0] & tests[1]) < 5, len(tests[0] & tests[1])
