"""Which curves a report draws: the panels of each kind of run (RL, SFT, DPO, RM) and
`plan_panel`, which turns a panel and the metric rows into the lines to draw (pure Python, no
plotting, so the choices are unit-tested).

A series that is 0 at every step is not drawn (it is named under the panel instead); series equal
at every step (e.g. `critic/score/mean` and `reward/acc` under a 0/1 reward) are drawn once, with
all their names in the legend; a panel left with nothing to draw becomes one line of text.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from reinforge.report.metrics import match_keys, series

ON_POLICY = ("expected when each batch gets one update on its own rollouts (actor.ppo_epochs 1, "
             "one mini-batch): the new/old probability ratios are 1")


@dataclass(frozen=True)
class Panel:
    """title: plain words; keys: metric names or globs (`val/pass@*`), drawn in this order;
    zero_note / absent_note: why the panel may be all zero / not logged, shown in its place;
    smooth: False for curves that are not noisy (a learning-rate schedule)."""
    slug: str
    title: str
    ylabel: str
    keys: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    zero_note: str = ""
    absent_note: str = ""
    smooth: bool = True


VAL_ACC = ("val/acc_greedy", "val/acc_sampled", "val/pass@*")  # the short names every run logs

RL_PANELS = [
    Panel("reward", "Reward of training rollouts", "mean per response",
          ("critic/score/mean", "critic/rewards/mean", "reward/acc", "reward/*/mean")),
    Panel("validation_accuracy", "Validation accuracy", "fraction correct", VAL_ACC,
          absent_note="set data.val_files to measure it"),
    Panel("kl_to_reference", "KL to the reference policy", "KL (nats / token)",
          ("actor/kl_loss", "actor/reward_kl_penalty", "actor/ref_kl"),
          absent_note="no reference model in this run (actor.use_kl_loss and algorithm.use_kl_in_reward are off)"),
    Panel("old_new_policy_kl", "Old-vs-new policy KL (within an update)", "KL (nats / token)",
          ("actor/ppo_kl",), zero_note=ON_POLICY),
    Panel("clip_fraction", "Clip fraction", "fraction of tokens",
          ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "critic/vf_clipfrac"), zero_note=ON_POLICY),
    Panel("entropy", "Policy entropy", "nats / token", ("actor/entropy",)),
    Panel("response_length", "Response length", "tokens",
          ("response_length/mean", "response_length/correct_mean", "response_length/incorrect_mean")),
    Panel("policy_loss", "Policy-gradient loss", "loss", ("actor/pg_loss",)),
    Panel("value_loss", "Value loss", "loss", ("critic/vf_loss",), absent_note="no critic in this run"),
    Panel("grad_norm", "Gradient norm (before clipping)", "L2 norm", ("actor/grad_norm", "critic/grad_norm")),
    Panel("zero_variance_groups", "Groups whose rewards are all equal (no signal)", "fraction of groups",
          ("diag/zero_var_group_frac",)),
    Panel("advantage_position_correlation", "Correlation of advantage with token position", "Pearson r",
          ("diag/adv_pos_corr",)),
    Panel("agent_episodes", "Agent episodes: turns and tool calls", "per episode",
          ("agent/turns_mean", "agent/tool_calls_mean", "agent/tool_errors", "val/agent/turns_mean"),
          absent_note="single-turn run: rollout.max_turns > 1 with tools or an env runs episodes"),
    Panel("agent_limits", "Agent episodes ended by a limit", "fraction of episodes",
          ("agent/truncated_episodes", "agent/budget_exhausted"),
          zero_note="every episode ended with a final answer",
          absent_note="single-turn run: rollout.max_turns > 1 with tools or an env runs episodes"),
    Panel("agent_tool_latency", "Tool latency", "seconds per call", ("agent/tool_latency_s",),
          absent_note="single-turn run: rollout.max_turns > 1 with tools or an env runs episodes"),
    Panel("timing", "Time per stage of a step", "seconds", ("timing_s/*",), exclude=("timing_s/step", "timing_s/val")),
    Panel("validation_time", "Time per validation", "seconds", ("timing_s/val",)),
    Panel("throughput", "Throughput", "tokens / s", ("perf/throughput",)),
]

SFT_PANELS = [
    Panel("loss", "Loss (token cross-entropy)", "nats / token", ("train/loss", "val/loss")),
    Panel("validation_accuracy", "Validation accuracy (generation on eval prompts)", "fraction correct",
          VAL_ACC, absent_note="set eval.prompt_files to measure it"),
    Panel("validation_perplexity", "Validation perplexity", "perplexity", ("val/ppl",),
          absent_note="set data.val_files to measure it"),
    Panel("grad_norm", "Gradient norm (before clipping)", "L2 norm", ("train/grad_norm",)),
    Panel("learning_rate", "Learning rate", "lr", ("train/lr",), smooth=False),
    Panel("throughput", "Throughput", "tokens / s", ("perf/throughput",)),
]


def _pair_panels(margin_title: str) -> list[Panel]:
    """Panels DPO and RM share: their metric names are the same (rewards/* are DPO's implicit
    rewards beta * log-ratio, and the reward model's scores)."""
    return [
        Panel("loss", "Loss", "loss", ("loss", "val/loss")),
        Panel("pairwise_accuracy", "Pairwise accuracy (reward of chosen > rejected)", "fraction of pairs",
              ("rewards/accuracies", "val/rewards/accuracies")),
        Panel("reward_margin", margin_title, "reward", ("rewards/margins", "val/rewards/margins")),
        Panel("rewards", "Rewards of chosen and rejected responses", "reward",
              ("rewards/chosen", "rewards/rejected", "val/rewards/chosen", "val/rewards/rejected")),
    ]


DPO_PANELS = _pair_panels("Implicit reward margin (chosen - rejected)") + [
    Panel("logps", "Log-probability of chosen and rejected responses", "log-prob (sequence)",
          ("logps/chosen", "logps/rejected", "val/logps/chosen", "val/logps/rejected")),
    Panel("nll_chosen", "NLL of chosen responses (RPO term)", "nats / token", ("nll/chosen", "val/nll/chosen"),
          absent_note="logged when dpo.nll_coef > 0"),
    Panel("validation_accuracy", "Validation accuracy (generation on eval prompts)", "fraction correct",
          VAL_ACC, absent_note="set eval.prompt_files to measure it"),
    Panel("grad_norm", "Gradient norm (before clipping)", "L2 norm", ("grad_norm",)),
    Panel("learning_rate", "Learning rate", "lr", ("lr",), smooth=False),
]

RM_PANELS = _pair_panels("Reward margin (chosen - rejected)") + [
    Panel("grad_norm", "Gradient norm (before clipping)", "L2 norm", ("grad_norm",)),
    Panel("learning_rate", "Learning rate", "lr", ("lr",), smooth=False),
]

PANELS = {"rl": RL_PANELS, "sft": SFT_PANELS, "dpo": DPO_PANELS, "rm": RM_PANELS}


@dataclass
class Line:
    """One drawn curve: every name in `names` has these values at these steps."""
    names: list[str]
    steps: list[int]
    values: list[float]

    @property
    def label(self) -> str:
        return " = ".join(self.names)


@dataclass
class PanelPlan:
    panel: Panel
    lines: list[Line] = field(default_factory=list)
    zero: list[str] = field(default_factory=list)  # series 0 at every step, not drawn

    @property
    def note(self) -> str | None:
        """The one line shown instead of an empty panel; None when there is a curve to draw."""
        if self.lines:
            return None
        p = self.panel
        if self.zero:
            return f"{p.title} ({', '.join(self.zero)}): 0 at every step" + (f" ({p.zero_note})" if p.zero_note else "")
        return f"{p.title} ({', '.join(p.keys)}): not logged" + (f" ({p.absent_note})" if p.absent_note else "")


def _same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    # float32 metrics logged through different paths differ in the last bits (5e-3 vs 4.99999e-3)
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def _is_zero(values: list[float]) -> bool:
    finite = [v for v in values if math.isfinite(v)]
    return bool(finite) and all(v == 0 for v in finite)


def plan_panel(rows: list[dict], panel: Panel) -> PanelPlan:
    """The lines of `panel` for these metric rows: series in key order, zero series set aside,
    equal series merged into the first one's line."""
    names = {k for r in rows for k in r}
    keys = [k for spec in panel.keys for k in match_keys(names, spec, panel.exclude)]
    plan = PanelPlan(panel)
    for key in dict.fromkeys(keys):  # a name two globs match is drawn once
        steps, values = series(rows, key)
        if not any(math.isfinite(v) for v in values):
            continue
        if _is_zero(values):
            plan.zero.append(key)
            continue
        twin = next((ln for ln in plan.lines if ln.steps == steps and all(map(_same, ln.values, values))), None)
        if twin is not None:
            twin.names.append(key)
        else:
            plan.lines.append(Line([key], steps, values))
    return plan
