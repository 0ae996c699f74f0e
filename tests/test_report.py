"""The report's choices on small synthetic metrics: which series a panel draws (zero, absent and
equal series; the KL panels' keys; validation aliases), the smoothing, the kind of run, and the
HTML grid."""
from __future__ import annotations

import json
import math

import pytest

from reinforge.report import write_report
from reinforge.report.metrics import match_keys, read_metrics, run_kind
from reinforge.report.panels import PANELS, RL_PANELS, plan_panel
from reinforge.report.smooth import centred_mean, smoothing_window

PANEL = {p.slug: p for p in RL_PANELS}


def _rows(n: int, **series) -> list[dict]:
    """n rows (steps 1..n); each keyword is a metric: a list of n values or a function of the step."""
    return [{"step": s, **{k.replace("__", "/"): (v(s) if callable(v) else v[s - 1]) for k, v in series.items()}}
            for s in range(1, n + 1)]


def test_smoothing_window_and_centred_mean():
    assert [smoothing_window(n) for n in (5, 29, 30, 120, 260, 10_000)] == [1, 1, 3, 9, 17, 51]
    # window 3: the mean of the point and its neighbours, cut at the ends; NaN stays a gap
    out = centred_mean([0.0, 3.0, 6.0, math.nan, 9.0], 3)
    assert out[:3] == [1.5, 3.0, 4.5] and math.isnan(out[3]) and out[4] == 9.0
    assert centred_mean([1.0, 2.0], 1) == [1.0, 2.0]


def test_kl_to_reference_is_not_the_old_new_policy_kl():
    rows = _rows(4, actor__kl_loss=lambda s: 0.01 * s, actor__ppo_kl=lambda s: 0.002 * s,
                 actor__reward_kl_penalty=lambda s: 0.03 * s)
    ref = plan_panel(rows, PANEL["kl_to_reference"])
    assert [ln.names for ln in ref.lines] == [["actor/kl_loss"], ["actor/reward_kl_penalty"]]
    assert [ln.names for ln in plan_panel(rows, PANEL["old_new_policy_kl"]).lines] == [["actor/ppo_kl"]]


def test_all_zero_and_absent_panels_become_one_line():
    rows = _rows(5, actor__ppo_kl=[0.0] * 5, actor__pg_clipfrac=[0.0, 0.0, math.nan, 0.0, 0.0],
                 actor__pg_clipfrac_lower=[0.0] * 5, actor__entropy=[0.7] * 5)
    clip = plan_panel(rows, PANEL["clip_fraction"])
    assert clip.lines == [] and clip.zero == ["actor/pg_clipfrac", "actor/pg_clipfrac_lower"]
    assert clip.note.startswith("Clip fraction (actor/pg_clipfrac, actor/pg_clipfrac_lower): 0 at every step (")
    assert "ratios are 1" in clip.note
    assert "0 at every step" in plan_panel(rows, PANEL["old_new_policy_kl"]).note
    kl = plan_panel(rows, PANEL["kl_to_reference"])
    assert kl.note == ("KL to the reference policy (actor/kl_loss, actor/reward_kl_penalty, actor/ref_kl): "
                       "not logged (no reference model in this run (actor.use_kl_loss and "
                       "algorithm.use_kl_in_reward are off))")
    assert plan_panel(rows, PANEL["entropy"]).note is None  # constant but not zero: drawn


def test_a_zero_series_beside_a_drawn_one_is_named_not_drawn():
    rows = _rows(3, actor__pg_clipfrac=[0.1, 0.0, 0.2], actor__pg_clipfrac_lower=[0.0] * 3)
    plan = plan_panel(rows, PANEL["clip_fraction"])
    assert [ln.names for ln in plan.lines] == [["actor/pg_clipfrac"]] and plan.zero == ["actor/pg_clipfrac_lower"]
    assert plan.note is None


def test_equal_series_are_drawn_once_with_every_name():
    score = [0.25, math.nan, 0.5, 0.75]
    rows = _rows(4, critic__score__mean=score, reward__acc=list(score), reward__fmt__mean=[1.0, 1.0, 1.0, 0.5],
                 reward__arithmetic__mean=[v * (1 + 1e-8) for v in score])  # float32 vs float64 rounding
    plan = plan_panel(rows, PANEL["reward"])
    assert [ln.names for ln in plan.lines] == [["critic/score/mean", "reward/acc", "reward/arithmetic/mean"],
                                               ["reward/fmt/mean"]]
    assert plan.lines[0].label == "critic/score/mean = reward/acc = reward/arithmetic/mean"
    # equal values at different steps are different series
    rows = [{"step": 1, "reward/acc": 0.5}, {"step": 2, "critic/score/mean": 0.5}]
    assert len(plan_panel(rows, PANEL["reward"]).lines) == 2


def test_validation_plots_the_short_names_not_their_val_core_aliases():
    rows = [{"step": s, "val/acc_greedy": 0.1 * s, "val/acc_sampled": 0.05 * s, "val/pass@1": 0.05 * s,
             "val/pass@16": 0.3, "val/pass@2": 0.2, "val-core/arithmetic/acc/mean@8": 0.05 * s,
             "val-core/arithmetic/acc/pass@2": 0.2, "val/arithmetic/acc_greedy": 0.1 * s} for s in (0, 10, 20)]
    plan = plan_panel(rows, PANEL["validation_accuracy"])
    assert [ln.names for ln in plan.lines] == [["val/acc_greedy"], ["val/acc_sampled", "val/pass@1"],
                                               ["val/pass@2"], ["val/pass@16"]]
    assert plan.lines[0].steps == [0, 10, 20]


def test_timing_panel_globs_stages_but_not_the_step_total():
    names = {"timing_s/gen", "timing_s/step", "timing_s/update_actor", "timing_s/val", "perf/throughput"}
    assert match_keys(names, "timing_s/*", PANEL["timing"].exclude) == ["timing_s/gen", "timing_s/update_actor"]
    assert match_keys(names, "timing_s/val") == ["timing_s/val"] and match_keys(names, "timing_s/x") == []


@pytest.mark.parametrize("keys, kind", [
    (["actor/pg_loss", "critic/score/mean"], "rl"), (["loss", "logps/chosen", "rewards/accuracies"], "dpo"),
    (["loss", "rewards/accuracies", "rewards/margins"], "rm"), (["train/loss", "train/lr"], "sft"),
    (["val/loss", "val/ppl"], "sft"), (["val/acc_greedy"], "rl")])
def test_run_kind_from_metric_names(keys, kind):
    assert run_kind([{"step": 1, **{k: 1.0 for k in keys}}]) == kind


def _write(run_dir, rows):
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_rl_report_html_grid_and_not_drawn_lines(tmp_path):
    rows = _rows(40, critic__score__mean=lambda s: s / 40, reward__acc=lambda s: s / 40,
                 actor__ppo_kl=lambda s: 0.0, actor__pg_clipfrac=lambda s: 0.0, actor__kl_loss=lambda s: 1e-3 * s,
                 actor__entropy=lambda s: 1.0 - s / 100, timing_s__gen=lambda s: 1.0, timing_s__step=lambda s: 2.0)
    _write(tmp_path, rows)
    (tmp_path / "samples").mkdir()
    (tmp_path / "samples" / "step_40.jsonl").write_text(json.dumps({"prompt": "1+1=", "response": "2", "score": 1.0}))
    (tmp_path / "samples" / "train_step_10.jsonl").write_text(
        json.dumps({"prompt": "<b>", "response": "3", "rewards": {"exact": 0.0, "fmt": None}, "advantage": -0.5}))
    page = write_report(tmp_path).read_text()
    assert "display:grid" in page and page.count('<div class="grid">') == 1
    assert page.count("<figure>") == 4  # all-zero ppo_kl and clip fraction are lines of text
    assert 'alt="Reward of training rollouts"' in page and "critic/score/mean = reward/acc" in page
    assert "Old-vs-new policy KL (within an update) (actor/ppo_kl): 0 at every step" in page
    assert "Value loss (critic/vf_loss): not logged (no critic in this run)" in page
    assert "From samples/step_40.jsonl (1 of 1 rows)" in page and "From samples/train_step_10.jsonl" in page
    # escaped; one column per reward function, blank where it did not apply
    assert "&lt;b&gt;" in page and "<th>rewards/exact</th><th>rewards/fmt</th>" in page
    assert "<td>0.000</td><td></td><td>-0.500</td>" in page
    pngs = {p.name for p in (tmp_path / "report").glob("*.png")}
    assert pngs == {"reward.png", "kl_to_reference.png", "entropy.png", "timing.png"}


@pytest.mark.parametrize("kind", ["rl", "sft", "dpo", "rm"])
def test_every_panel_of_a_kind_draws_when_its_metrics_are_logged(tmp_path, kind):
    """Synthetic rows holding every name a kind's panels ask for (globs given one name): one PNG
    per panel and nothing in the "not drawn" list."""
    keys = [k.replace("*", "1") for p in PANELS[kind] for k in p.keys]
    _write(tmp_path, _rows(6, **{k.replace("/", "__"): (lambda s, i=i: 0.1 * s + i) for i, k in enumerate(keys)}))
    page = write_report(tmp_path).read_text()
    assert run_kind(read_metrics(tmp_path)) == kind and "Not drawn" not in page
    assert {p.stem for p in (tmp_path / "report").glob("*.png")} == {p.slug for p in PANELS[kind]}


def test_empty_run_dir_says_no_metrics(tmp_path):
    (tmp_path / "config.yaml").write_text("model: {}\n")
    page = write_report(tmp_path).read_text()
    assert "No metrics yet." in page and "Not drawn" not in page and "model: {}" in page
