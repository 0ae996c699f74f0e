"""scripts/gpu_check.sh and the GPU check scripts, on CPU: the lean mode runs end to end with the
tiny shape (so it cannot rot before a GPU sees it), its bounds fail on what they check, and a
check that could not run exits 77, never 0 (issue 22)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"_gpu_script_{name}", ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sh(*args: str, tmp: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    if tmp is not None:  # the script's work folder (model, data, run) goes under pytest's
        env["TMPDIR"] = str(tmp)
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


@pytest.mark.slow
def test_lean_mode_runs_on_cpu(tmp_path):
    """No Ray, no vLLM, no network: the tiny shape through FSDP2 on gloo (world size 1), the lean
    rollout, two GRPO steps; every bound holds and the table has a row per step."""
    out = _sh("--device", "cpu", "--steps", "2", tmp=tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert len(rows) == 2, out.stdout
    assert "measured bf16 matmul peak" in out.stdout and "peak memory (peak RSS)" in out.stdout
    assert out.stdout.rstrip().endswith("OK")
    gap_max = float(rows[0].split("|")[7])  # lean and trainer forwards agree to rounding in bf16
    assert 0 <= gap_max < 0.05


def test_unknown_mode_is_a_usage_error():
    out = _sh("--mode", "fast")
    assert out.returncode == 2 and "--mode fast is not known" in out.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_skipped_checks_exit_77(monkeypatch, capsys):
    """Without CUDA (or vLLM / Ray) no check runs, and the exit status says so."""
    lean = _script("gpu_lean_check")
    assert lean.main(["--device", "cuda"]) == lean.EXIT_SKIPPED == 77
    for name in ("gpu_check", "gpu_vllm_check", "gpu_agent_check"):
        monkeypatch.setattr(sys, "argv", [name])
        assert _script(name).main() == 77, name
    assert capsys.readouterr().out.count("SKIPPED") == 4


def test_lean_check_bounds_by_hand():
    """check_step fails on each bound it names and passes a healthy step."""
    lean = _script("gpu_lean_check")
    args = lean.argparse.Namespace(max_gap=1.0, gap_growth=3.0)
    good = {"rollout_corr/logprob_gap_max": 0.2, "rollout_corr/logprob_gap_abs_mean": 0.01, "actor/pg_loss": 0.1,
            "actor/grad_norm": 1.0, "perf/mfu": 0.3, "actor/kl_loss": 0.001}
    rates = {"gen": 100.0, "old_log_prob": 0.0, "ref": 50.0, "update_actor": 20.0}
    assert lean.check_step(2, good, rates, 0.01, args, cuda=True) == []
    assert lean.check_step(2, {**good, "rollout_corr/logprob_gap_abs_mean": 0.05}, rates, 0.01, args, True) \
        == ["step 2: mean gap 0.05000 grew from step 1's 0.01000 (does the rollout generate with the updated weights?)"]
    assert "max |log-prob gap| 1.5000 > --max-gap 1.0" in lean.check_step(1, {**good, "rollout_corr/logprob_gap_max": 1.5},
                                                                         rates, None, args, True)[0]
    missing = {k: v for k, v in good.items() if k != "rollout_corr/logprob_gap_max"}
    assert lean.check_step(1, missing, rates, None, args, True) == \
        ["step 1: metrics ['rollout_corr/logprob_gap_max'] were not reported"]
    assert "non-finite" in lean.check_step(1, {**good, "actor/grad_norm": float("nan")}, rates, None, args, True)[0]
    assert "MFU 1.500" in lean.check_step(1, {**good, "perf/mfu": 1.5}, rates, None, args, True)[0]
    assert lean.check_step(1, {**good, "perf/mfu": 1.5}, rates, None, args, cuda=False) == []  # CPU: reported only
    assert "stages ['ref']" in lean.check_step(1, good, {**rates, "ref": 0.0}, None, args, True)[0]


def test_padded_tokenizer_decodes_every_id():
    lean = _script("gpu_lean_check")
    tok = lean.padded_char_tokenizer(300)
    assert len(tok) == 300
    assert tok.decode([299]) == f"<x{299 - 99}>"  # 3 special + 96 characters before the fillers
    assert tok("1+2=", add_special_tokens=False)["input_ids"] == [tok.convert_tokens_to_ids(c) for c in "1+2="]
