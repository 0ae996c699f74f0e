"""trainer.sequence_parallel=2 (Ulysses, models/seq_parallel.py): two gloo ranks in one group, each
holding half of every row's positions under FSDP2, against one process: the same old log-probs,
entropies and values, and the same gradient at every optimizer step of the actor's and the
critic's updates, on padded rows (fused log-prob head and logits path) and on packed rows."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.distributed.sp_ranks import CASES, run_case
from tests.grad_check import assert_same_steps

TOL = 1e-5
ROOT = Path(__file__).resolve().parents[2]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ranks(tiny_model_dir, tmp_path_factory) -> list[dict]:
    """Both ranks' results of every case (tests/distributed/sp_ranks.py, run as 2 processes)."""
    out, port = tmp_path_factory.mktemp("sp"), _port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests/distributed/sp_ranks.py"), str(r), str(port),
                               tiny_model_dir, str(out)], env=env, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    errs = [p.communicate(timeout=240)[1] for p in procs]
    for p, err in zip(procs, errs):
        assert p.returncode == 0, err[-3000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def _gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float((a - b)[mask.bool()].abs().max())


@pytest.mark.parametrize("case", list(CASES))
def test_two_sp_ranks_equal_one_process(case, ranks, tiny_model_dir):
    torch.set_num_threads(1)
    local = run_case(tiny_model_dir, case)
    mask = local["response_mask"]
    for r, res in enumerate(ranks):
        res = res[case]
        for key in ("old_log_probs", "entropy", "values"):
            assert _gap(res[key], local[key], mask) <= TOL, (case, r, key, _gap(res[key], local[key], mask))
        for role in ("actor", "critic"):
            assert_same_steps(local[f"{role}_grads"], res[f"{role}_grads"], TOL)
            lm, rm = local[f"{role}_metrics"], res[f"{role}_metrics"]
            assert lm.keys() == rm.keys()
            for k in lm:
                assert abs(lm[k] - rm[k]) <= 1e-5 * max(1.0, abs(lm[k])), (case, role, k, lm[k], rm[k])
