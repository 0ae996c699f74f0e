"""perf/* metrics: model FLOPs by hand, the peak-memory tracker, and a tiny run's metrics.jsonl."""
from __future__ import annotations

import json

import pytest

from reinforge.trainers.perf import PeakMemory, StageTimer, matmul_params, rl_step_flops

pytestmark = pytest.mark.usefixtures("one_thread")


def test_rl_step_flops_by_hand():
    # GRPO with a KL reference, on-policy: gen + ref forward-only (2N each), one update (6N).
    t = {"timing_s/gen": 1.0, "timing_s/reward": 0.1, "timing_s/ref": 0.2, "timing_s/update_actor": 0.5}
    assert rl_step_flops(t, 100, 10, 0, 1, 1) == 100 * (2 * 10 + 2 * 10 + 6 * 10)
    # PPO: old log-probs, values (critic 7 params), two epochs for each model.
    t = {"timing_s/gen": 1, "timing_s/old_log_prob": 1, "timing_s/values": 1, "timing_s/update_actor": 1,
         "timing_s/update_critic": 1}
    assert rl_step_flops(t, 3, 10, 7, 2, 2) == 3 * (2 * (10 + 10 + 7) + 6 * (2 * 10 + 2 * 7))


def test_matmul_params_leave_out_an_untied_embedding(tiny_model_dir):
    from reinforge.models.loading import load_causal_lm

    model = load_causal_lm(tiny_model_dir, dtype="float32")
    total = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    tied = emb is model.get_output_embeddings().weight
    assert matmul_params(model) == (total if tied else total - emb.numel())


def test_nested_stages_keep_the_inner_peak():
    """An inner stage's peak counts for the outer stage too, though the mark is reset inside."""
    readings = iter([0.0, 5.0, 9.0, 2.0, 0.0, 1.0])  # what each boundary reads

    class Fake(PeakMemory):
        def _read_and_reset(self):
            return next(readings)

    mem = Fake("cpu")
    mem.start()               # outer starts (reads 0)
    mem.start()               # inner starts: 5 so far belongs to outer
    assert mem.stop() == 9.0  # inner ends at 9, credited to outer as well
    assert mem.stop() == 9.0  # outer: max(5, 9, 2)
    mem.start()
    assert mem.stop() == 1.0  # a later stage starts afresh


def test_stage_timer_reports_step_peak():
    """Each stage's peak is its own: 256 MiB held only inside stage a raise a's peak, not b's
    (without the reset at the stage boundary, b would report a's high-water mark)."""
    timer = StageTimer("cpu")
    with timer("a"):
        blob = bytearray(256 * 2 ** 20)  # touched: resident; freed (unmapped) before b
        blob[::4096] = b"x" * len(blob[::4096])
        del blob
    with timer("b"):
        pass
    m = timer.pop()
    assert set(m) == {"timing_s/a", "timing_s/b", "perf/cpu_rss_peak_gb/a", "perf/cpu_rss_peak_gb/b",
                      "perf/cpu_rss_peak_gb"}
    assert m["perf/cpu_rss_peak_gb"] == max(m["perf/cpu_rss_peak_gb/a"], m["perf/cpu_rss_peak_gb/b"])
    assert m["perf/cpu_rss_peak_gb/a"] - m["perf/cpu_rss_peak_gb/b"] > 0.2, m


def test_rl_run_logs_mfu_and_memory(tiny_model_dir, arith_data, tmp_path):
    """A GRPO run with a KL loss (on-policy: no old-log-prob pass) logs perf/mfu in (0, 1],
    peak RSS per stage, and entropy and ref KL from the update pass."""
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.rl import RLTrainer
    from tests.conftest import rl_overrides

    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path / "run"),
                                                     **{"data.val_files": "[]", "actor.use_kl_loss": True}))
    RLTrainer(cfg).fit()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/mfu" in r]
    assert len(steps) == 2
    for r in steps:
        assert 0 < r["perf/mfu"] <= 1
        assert 0.05 < r["perf/cpu_rss_peak_gb"] < 64
        for stage in ("gen", "ref", "update_actor"):
            assert 0 < r[f"perf/cpu_rss_peak_gb/{stage}"] <= r["perf/cpu_rss_peak_gb"]
        assert "timing_s/old_log_prob" not in r and r["actor/entropy"] > 0 and "actor/ref_kl" in r


def test_bf16_autocast_log_probs_near_fp32(tiny_model_dir):
    """model.autocast=bf16 runs the decoder in bfloat16 (the log-probs move, by bf16 rounding
    only) and hands back fp32 log-probs from the fp32 head."""
    import torch

    from reinforge.config.schema import ModelConfig
    from reinforge.models.loading import load_causal_lm
    from reinforge.workers.actor import micro_log_probs
    from tests.conftest import ragged_batch

    model = load_causal_lm(tiny_model_dir, dtype="float32")
    mb = ragged_batch(model.config.vocab_size, B=8, P=4, T=6)
    with torch.no_grad():
        lp32, _ = micro_log_probs(model, mb, ModelConfig(path=tiny_model_dir), 1.0, False)
        lp16, ent = micro_log_probs(model, mb, ModelConfig(path=tiny_model_dir, autocast="bf16"), 1.0, True)
    gap = (lp16 - lp32)[mb["response_mask"].bool()].abs().max()
    assert lp16.dtype == ent.dtype == torch.float32
    assert 0 < gap < 0.05


def test_peak_measurement_leaves_the_rng_alone():
    """The peak is measured inside a step: drawing from the global RNG there would shift the
    training stream of the first run in a process only (the result is cached), and a resumed
    run would no longer equal an uninterrupted one."""
    import torch

    from reinforge.trainers.perf import matmul_peak_flops

    matmul_peak_flops.cache_clear()
    state = torch.random.get_rng_state()
    assert matmul_peak_flops("cpu") > 0
    assert torch.equal(torch.random.get_rng_state(), state)


def test_bf16_weights_fused_log_probs(tiny_model_dir):
    """model.dtype=bfloat16 (weights in bf16, no autocast): the fused head path takes the bf16
    hidden states with the bf16 head (a float32 cast of h alone failed on the dtype mismatch)
    and agrees with the logits path to bf16 rounding."""
    import torch

    from reinforge.config.schema import ModelConfig
    from reinforge.models.loading import load_causal_lm
    from reinforge.workers.actor import micro_log_probs
    from tests.conftest import ragged_batch

    model = load_causal_lm(tiny_model_dir, dtype="bfloat16")
    mb = ragged_batch(model.config.vocab_size, B=8, P=4, T=6)
    with torch.no_grad():
        fused, _ = micro_log_probs(model, mb, ModelConfig(path=tiny_model_dir, fused_logprobs=True), 1.0, False)
        plain, _ = micro_log_probs(model, mb, ModelConfig(path=tiny_model_dir, fused_logprobs=False), 1.0, False)
    mask = mb["response_mask"].bool()
    assert fused.dtype == torch.float32 and torch.isfinite(fused[mask]).all()
    assert (fused - plain)[mask].abs().max() < 0.05
