"""Metric reduction of the one update loop: `*_max` metrics are maxima over micro-batches,
mini-batches (and ranks), every other metric a share-weighted mean; and an on-policy update
reports the rollout/trainer log-prob gap's maximum as the off-policy one does (issue 22, item 1:
scripts/gpu_check.py read `rollout_corr/logprob_gap_max` and found none)."""
from __future__ import annotations

import pytest
import torch

from reinforge.workers.update_loop import LossTerm, MetricSum, MiniBatch, run_update
from tests.test_onpolicy import _actor, _batch

pytestmark = pytest.mark.usefixtures("one_thread")


def test_metric_sum_max_and_mean_by_hand():
    s = MetricSum()
    s.add({"gap_max": torch.tensor(0.3), "gap_mean": torch.tensor(1.0)}, 0.25)
    s.add({"gap_max": torch.tensor(0.9), "gap_mean": torch.tensor(3.0)}, 0.75)
    s.add({"gap_max": torch.tensor(0.5), "gap_mean": torch.tensor(2.0)}, 1.0)  # a second mini-batch
    out = s.all_reduce().result("a/", 2)
    assert out["a/gap_max"] == pytest.approx(0.9)  # neither weighted nor divided by the mini-batches
    assert out["a/gap_mean"] == pytest.approx((0.25 * 1 + 0.75 * 3 + 2.0) / 2)


def test_run_update_keeps_the_largest_max_over_micro_and_mini_batches():
    def term(out, micro, denom):
        return torch.tensor(0.0), {"x_max": torch.tensor(micro), "x": torch.tensor(micro)}

    minis = [MiniBatch(None, [(1.0, 0.5), (4.0, 0.5)]), MiniBatch(None, [(2.0, 1.0)])]
    m = run_update(minis, [LossTerm("loss", 1.0, term)]).metrics("p/")
    assert m["p/x_max"] == 4.0
    assert m["p/x"] == pytest.approx(((1 + 4) / 2 + 2) / 2)


def test_on_policy_update_reports_the_gap_max(tiny_model_dir):
    """Two micro-batches of 4 rows: the maximum |old - rollout| over all 8 rows, as the
    off-policy update (separate old-log-prob pass) reports it."""
    off, on = _actor(tiny_model_dir, tis_cap=2.0), _actor(tiny_model_dir, on_policy=True, tis_cap=2.0)
    batch = _batch(off.model.config.vocab_size)
    old = off.log_probs(batch)
    g = torch.Generator().manual_seed(5)
    mask = batch["response_mask"]
    shift = torch.zeros(mask.shape)
    shift[6, int(mask[6].nonzero()[0])] = 0.7  # the largest gap, on one token of the second micro-batch
    rollout = (old["old_log_probs"] - 0.1 * torch.rand(mask.shape, generator=g) - shift) * mask
    from reinforge.protocol import Batch

    batch = batch | Batch({"rollout_log_probs": rollout})
    want = float(((old["old_log_probs"] - rollout) * mask).abs().max())
    assert want == pytest.approx(0.7, abs=0.1)
    m_off, m_on = off.update(batch | old.select(["old_log_probs"])), on.update(batch)
    assert m_off["rollout_corr/logprob_gap_max"] == pytest.approx(want, abs=1e-5)
    assert m_on["rollout_corr/logprob_gap_max"] == pytest.approx(want, abs=1e-5)
    assert m_on["rollout_corr/logprob_gap_abs_mean"] == pytest.approx(m_off["rollout_corr/logprob_gap_abs_mean"],
                                                                      abs=1e-5)
