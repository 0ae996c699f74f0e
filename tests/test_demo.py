"""`reinforge demo --quick`: the whole pipeline (data -> tiny model -> SFT -> GRPO) end to end."""
from __future__ import annotations

import json
import math

import pytest

from reinforge.cli.main import main


@pytest.mark.slow
def test_demo_quick_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out)]) == 0
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
    report = json.loads((out / "demo_report.json").read_text())
    for stage in ("base", "rl"):
        for key in ("acc_greedy", "acc_sampled"):
            v = report[stage][key]
            assert isinstance(v, float) and 0.0 <= v <= 1.0, (stage, key, v)
    assert math.isfinite(report["delta_acc_greedy"]) and report["time_s"]["total"] > 0
