"""`reinforge demo --quick`: the whole pipeline (data -> tiny model -> SFT -> GRPO) end to end."""
from __future__ import annotations

import json
import math

import pytest

from reinforge.cli.demo import make_inputs, stage_seeds
from reinforge.cli.main import main
from reinforge.data.io import load_rows


@pytest.mark.slow
def test_demo_quick_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    # twice into one out dir, as `make demo` repeated: the second run replaces the first
    for _ in range(2):
        assert main(["demo", "--quick", "--seed", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "SFT base" in printed and "acc_greedy" in printed and str(out) in printed
    for f in ("data/train.parquet", "data/test.parquet", "data/sft.parquet", "model/config.json",
              "sft/hf/config.json", "sft/metrics.jsonl", "demo_report.json"):
        assert (out / f).exists(), f
    rl = out / "grpo"
    assert (rl / "hf" / "config.json").exists() and (rl / "config.yaml").exists()
    assert any((rl / "checkpoints").glob("step_*/COMPLETE")), "no complete RL checkpoint"
    assert any((rl / "report").iterdir()), "empty RL report"
    rows = [json.loads(x) for x in (rl / "metrics.jsonl").read_text().splitlines()]
    assert any("actor/pg_loss" in r for r in rows)
    assert [r["step"] for r in rows if "val/acc_greedy" in r] == [0, 2]  # this run's rows only
    report = json.loads((out / "demo_report.json").read_text())
    assert report["seed"] == 1 and report["task"]["data_seed"] == 1 and report["task"]["train_seed"] == 2
    for stage in ("base", "rl"):
        for key in ("acc_greedy", "acc_sampled"):
            v = report[stage][key]
            assert isinstance(v, float) and 0.0 <= v <= 1.0, (stage, key, v)
    assert math.isfinite(report["delta_acc_greedy"]) and report["time_s"]["total"] > 0


def _inputs(out, seed):
    """(held-out test prompts, model weights) that `reinforge demo --quick --seed seed` starts from."""
    from safetensors.torch import load_file

    paths, task = make_inputs(out, True, seed)
    assert (task["data_seed"], task["model_seed"]) == (seed, seed)
    return [r["prompt"] for r in load_rows(paths["test"])], load_file(str(out / "model" / "model.safetensors"))


def test_demo_seed_changes_data_split_and_model_init(tmp_path):
    test0, w0 = _inputs(tmp_path / "s0", 0)
    test1, w1 = _inputs(tmp_path / "s1", 1)
    again1, w1_again = _inputs(tmp_path / "s1_again", 1)
    assert test1 == again1 and all(w1[k].equal(w1_again[k]) for k in w1)  # a seed is reproducible
    assert set(test0) != set(test1)  # another held-out set (and so another SFT/RL split)
    assert not w0["model.embed_tokens.weight"].equal(w1["model.embed_tokens.weight"])
    # seed 0 keeps the trainers' seed of the presets (trainer.seed: 1)
    assert stage_seeds(0)["train_seed"] == 1 and stage_seeds(2)["train_seed"] == 3
