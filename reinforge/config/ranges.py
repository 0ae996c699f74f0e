"""The valid range of every numeric config key, in one table, and the check that walks a config.

RANGES maps a config dataclass's name (not the class: the config modules import this one) to
{field: interval}; a subclass inherits its bases' entries and may override them
(SFTOptimConfig reads AdamWConfig's). Intervals are written as in mathematics, "[0, 1)" or
"(0, inf)"; "each [1, inf)" applies to every element of a list. A None value passes (Optional
fields: None means "off"). tests/test_config.py checks that every int/float field of every
config has an entry, so a new knob cannot skip the table.

The algorithm registries' hyper-parameters (actor.clip_low, algorithm.lam, ...) are not in the
table: their ranges are their params' (reinforge.algos.registry.param, read through
config/registries.py), as are those of any field declared with `param(...)`.
"""
from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

from reinforge.config.load import ConfigError
from reinforge.config.registries import param_range

# > 0; >= 0 (a real, then a count); >= 1 (a size); a fraction; a probability that cannot be 0.
POS, NONNEG, COUNT, SIZE, UNIT, PROB = "(0, inf)", "[0, inf)", "[0, inf)", "[1, inf)", "[0, 1]", "(0, 1]"

RANGES: dict[str, dict[str, str]] = {
    # reinforge/config/common.py
    "AdamWConfig": dict(lr=NONNEG, weight_decay=NONNEG, betas="each [0, 1)", warmup_steps=COUNT, grad_clip=NONNEG,
                        max_nonfinite_steps=SIZE),
    "OptimConfig": dict(micro_batch_size=SIZE),
    "RunConfig": dict(seed=COUNT, save_every=COUNT, keep_last=COUNT, val_every=COUNT),
    "SupervisedRunConfig": dict(total_steps=COUNT, epochs=NONNEG),
    "GenEvalConfig": dict(max_prompt_length=SIZE, max_response_length=SIZE, max_samples=SIZE, n=SIZE,
                          temperature=POS, batch_size=SIZE),
    # reinforge/config/schema.py (RL)
    "ModelConfig": dict(logprob_chunk_size=COUNT, lora_rank=COUNT, lora_alpha=POS, memory_budget_gb=NONNEG),
    "DataConfig": dict(max_prompt_length=SIZE, train_batch_size=SIZE, val_batch_size=SIZE, max_val_samples=SIZE,
                       seed=COUNT, max_pixels=SIZE),
    "RolloutConfig": dict(n=SIZE, temperature=POS, top_p=PROB, top_k=COUNT, max_response_length=SIZE,
                          micro_batch_size=SIZE, val_n=SIZE, val_temperature=POS, gpu_memory_utilization=PROB,
                          cpu_kv_cache_gb=POS, cpu_threads=COUNT,
                          tis_cap=POS, staleness=COUNT, stream_prompts=COUNT, max_turns=SIZE,
                          agent_concurrency=SIZE, agent_timeout_s=POS),
    "ActorConfig": dict(ppo_epochs=SIZE, mini_batch_size=COUNT, micro_batch_size=COUNT,
                        max_tokens_per_micro_batch=COUNT, loss_norm_const=POS, entropy_coeff=NONNEG,
                        kl_loss_coef=NONNEG, max_nonfinite_steps=SIZE, router_aux_loss_coef=NONNEG),  # + the policy losses' params
    "CriticConfig": dict(ppo_epochs=SIZE, mini_batch_size=COUNT, micro_batch_size=COUNT,
                         max_tokens_per_micro_batch=COUNT, cliprange_value=POS, warmup_actor_freeze_steps=COUNT),
    "AlgorithmConfig": dict(kl_coef=NONNEG, target_kl=POS, kl_horizon=SIZE, max_gen_rounds=SIZE,
                            overlong_buffer_len=COUNT, overlong_penalty_factor=NONNEG,
                            value_pretrain_steps=COUNT),  # + the advantage estimators' params
    "RewardConfig": dict(num_workers=COUNT, timeout_s=POS, default_score="(-inf, inf)", max_error_rate=UNIT,
                         clip_min="(-inf, inf)", clip_max="(-inf, inf)"),
    "LengthPenaltyConfig": dict(coef=NONNEG, free_tokens=COUNT),
    "FormatConfig": dict(score=NONNEG, penalty=NONNEG),
    "JudgeConfig": dict(max_new_tokens=SIZE, score_scale=POS, batch_size=SIZE, max_length=COUNT),
    "TrainerConfig": dict(total_steps=SIZE, nnodes=SIZE, devices_per_node=SIZE, sequence_parallel=SIZE, pass_k="each [1, inf)",
                          log_samples_every=COUNT, rollout_workers=SIZE, weight_sync_timeout_s=POS),
    "TeacherConfig": dict(coef=NONNEG, beta=UNIT, task_reward_weight=NONNEG),
    # reinforge/config/sft.py
    "SFTDataConfig": dict(max_length="[2, inf)", batch_size=SIZE, seed=COUNT, max_pixels=SIZE),
    "SFTEvalConfig": dict(pass_k="each [1, inf)"),
    # reinforge/config/preference.py
    "PrefDataConfig": dict(val_fraction="[0, 1)", max_val_pairs=SIZE, max_length="[2, inf)", batch_size=SIZE,
                           seed=COUNT, max_pixels=SIZE),
    "DPOParams": dict(beta=POS, label_smoothing="[0, 0.5)", nll_coef=NONNEG, simpo_gamma=NONNEG,
                      desirable_weight=NONNEG, undesirable_weight=NONNEG),
    "RMParams": dict(center_rewards_coef=NONNEG),
}


def in_interval(value: float, interval: str) -> bool:
    """Whether `value` lies in `interval` ("[0, 1)", "(0, inf)"); NaN lies in none."""
    lo_s, hi_s = interval.split(",")
    lo, hi = float(lo_s.strip()[1:]), float(hi_s.strip()[:-1])
    above = value >= lo if lo_s.strip()[0] == "[" else value > lo
    below = value <= hi if hi_s.strip()[-1] == "]" else value < hi
    return bool(above and below)


def range_of(cls: type, name: str) -> str | None:
    """The interval of field `name` of dataclass `cls`: its `param(...)` range, else its registry
    param's (config/registries.py), else the nearest class in its MRO that lists it in RANGES."""
    f = getattr(cls, "__dataclass_fields__", {}).get(name)
    if f is not None and f.metadata.get("range") is not None:
        return f.metadata["range"]
    spec = param_range(cls, name)
    if spec is not None:
        return spec
    for klass in cls.__mro__:
        spec = RANGES.get(klass.__name__, {}).get(name)
        if spec is not None:
            return spec
    return None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_value(key: str, value: Any, spec: str) -> None:
    each = spec.startswith("each ")
    interval = spec[5:] if each else spec
    values = value if each else [value]
    if each and not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}={value!r} must be a list of numbers, each in {interval}")
    for i, v in enumerate(values):
        shown = f"{key}[{i}]" if each else key
        if not _is_number(v):
            raise ConfigError(f"{shown}={v!r} must be a number in {interval}")
        if not in_interval(v, interval):  # open at infinity, so inf and NaN never pass
            raise ConfigError(f"{shown}={v!r} is out of range; valid range: {interval}")


def check_ranges(cfg: Any, prefix: str = "") -> None:
    """Every numeric field of config `cfg` (recursively) lies in its RANGES interval; the error
    names the full dotted key, the value and the interval. None values pass."""
    for f in fields(cfg):
        value, key = getattr(cfg, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            check_ranges(value, key + ".")
            continue
        spec = range_of(type(cfg), f.name)
        if spec is not None and value is not None:
            _check_value(key, value, spec)
