"""kill -9 and --resume with rollout.backend=vllm: a CLI run in a subprocess is killed (SIGKILL)
once a checkpoint is complete, then resumed in this process: the resumed run's engine is built
from model.path and synced from the checkpoint's actor, so its log-probs are the trainer's."""
from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the real-vLLM tests run in .venv-vllm: make test-vllm")
pytestmark = pytest.mark.vllm

from tests.vllm_real.test_train import VLLM  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _complete(run: Path) -> list[int]:
    return sorted(int(p.parent.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*/COMPLETE"))


def test_kill_9_then_resume(vllm_model_dir, arith_data, tmp_path):
    from reinforge.cli.main import main
    from tests.conftest import rl_overrides

    run = tmp_path / "run"
    args = rl_overrides(vllm_model_dir, arith_data, str(run), **VLLM, **{"trainer.save_every": 1,
                        "trainer.val_before_train": False, "data.val_files": "[]", "trainer.export_hf": False})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "reinforge.cli.main", "train", "--config", "grpo", *args,
                             "trainer.total_steps=200"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while not (run / "checkpoints").is_dir() or not _complete(run):
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.time() < deadline, "no checkpoint within 240 s"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    last = _complete(run)[-1]
    assert last < 200
    gc.collect()
    assert main(["train", "--config", "grpo", "--resume", *args, f"trainer.total_steps={last + 2}"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    resumed = [r for r in rows if r["step"] > last]
    assert [r["step"] for r in resumed][-2:] == [last + 1, last + 2]
    for r in resumed[-2:]:  # the resumed engine samples from the checkpoint's weights, then the update's
        assert r["rollout_corr/logprob_gap_max"] < 1e-4, r["rollout_corr/logprob_gap_max"]
    gc.collect()
