"""data/pairs.py: a model's samples, scored, ranked into DPO pairs and KTO rows (hand-made scores),
and `reinforge data pairs`'s bad input refused in one line before a model loads."""
from __future__ import annotations

import pandas as pd
import pytest

from reinforge.data.pairs import rank_samples, write_pairs


def test_best_and_worst_of_each_group_and_ties_give_nothing(tmp_path):
    prompts = ["p0", "p1", "p2", "p3"]
    responses = ["a", "b", "c", "d",      # p0: scores 0, 1, 0.5, 1 -> chosen b (first best), rejected a
                 "e", "f", "g", "h",      # p1: all 0 -> no pair
                 "i", "j", "k", "l",      # p2: the best one unfinished -> j vs i among the finished
                 "m", "m", "n", " "]      # p3: a blank reply left out; m twice: one KTO row
    scores = [0, 1, 0.5, 1, 0, 0, 0, 0, 0, 0.5, 1, 0, 1, 1, 0, 1]
    finished = [True] * 16
    finished[10] = False
    pairs, kto = rank_samples(prompts, responses, scores, 4, finished)
    assert [(p["prompt"], p["chosen"], p["rejected"], p["chosen_score"], p["rejected_score"]) for p in pairs] == [
        ("p0", "b", "a", 1, 0), ("p2", "j", "i", 0.5, 0), ("p3", "m", "n", 1, 0)]
    assert [(r["prompt"], r["completion"], r["label"]) for r in kto] == [
        ("p0", "a", False), ("p0", "b", True), ("p0", "d", True), ("p2", "i", False), ("p2", "j", True),
        ("p2", "l", False), ("p3", "m", True), ("p3", "n", False)]  # middle scores (c) left out
    paths = write_pairs(tmp_path, pairs, kto)
    assert pd.read_parquet(paths["prefs"])["chosen"].tolist() == ["b", "j", "m"]
    assert pd.read_parquet(paths["kto"])["label"].tolist() == [r["label"] for r in kto]
    with pytest.raises(ValueError, match="4 prompts x n=3 need 12 responses"):
        rank_samples(prompts, responses, scores, 3)


def test_cli_refuses_bad_input_before_loading(tiny_model_dir, arith_data, tmp_path, capsys, no_model_loads):
    from reinforge.cli.main import main

    base = ["data", "pairs", "--model", tiny_model_dir, "--data", arith_data["train"], "--reward", "arithmetic",
            "--out", str(tmp_path / "p")]
    for extra, msg in ((["--n", "1"], "--n=1: a pair needs at least 2 samples"),
                       (["--temperature", "0"], "--temperature=0.0: sampling needs a temperature > 0")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err
        assert msg in err and err.count("\n") == 1, err
    assert main(base[:4] + ["--data", str(tmp_path / "none.parquet")] + base[6:]) == 2
    assert "no such file" in capsys.readouterr().err
