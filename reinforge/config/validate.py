"""Derive and check a config in one place, before any model loads: `validate` for RL, and the
checks the supervised trainers (SFT, DPO, RM) share.

Each rule fails with one ConfigError naming the keys involved and the rule broken.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional, Sequence

from reinforge.config.common import AdamWConfig
from reinforge.config.hints import did_you_mean
from reinforge.config.load import ConfigError
from reinforge.config.ranges import check_ranges
from reinforge.config.registries import check_entries
from reinforge.config.schema import RLConfig
from reinforge.data.hf_datasets import is_dataset_source
from reinforge.data.rl_dataset import OVERLONG_POLICIES

LR_SCHEDULES = ("constant", "cosine", "linear")
MODEL_DTYPES = ("auto", "float32", "bfloat16", "float16")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
VAL_SAMPLED = ("end", "always", "never")  # trainer.val_sampled: when sampled validation runs


def need(cond: bool, msg: str) -> None:
    """Raise ConfigError(msg) unless `cond` holds."""
    if not cond:
        raise ConfigError(msg)


def check_name(value: str, valid, key: str) -> None:
    """`value` must be one of the registry names `valid` (message lists them sorted)."""
    if value not in valid:
        raise ConfigError(f"{key}={value!r} is not known; valid: {sorted(valid)}")


def check_choice(value: str, valid: Sequence[str], key: str) -> None:
    """`value` must be one of `valid`; the message spells them out: "key='x': a, b or c"."""
    spelled = ", ".join(valid[:-1]) + " or " + valid[-1] if len(valid) > 1 else valid[0]
    need(value in valid, f"{key}={value!r}: {spelled}")


def check_adamw(o: AdamWConfig, section: str) -> None:
    """The AdamW settings every optimizer section shares (actor, critic, SFT/DPO/RM optim)."""
    check_choice(o.lr_schedule, LR_SCHEDULES, f"{section}.lr_schedule")
    need(len(o.betas) == 2, f"{section}.betas={list(o.betas)} must be two numbers [beta1, beta2]")


def check_model_and_run(model, run) -> None:
    """The model and run sections every trainer shares: names checked here, not when the model
    loads or the first metric is logged."""
    check_choice(model.dtype, MODEL_DTYPES, "model.dtype")
    check_choice(model.autocast, ("none", "bf16"), "model.autocast")
    check_choice(model.attn_implementation, ATTN_IMPLEMENTATIONS, "model.attn_implementation")
    need(model.lora_rank == 0 or bool(model.lora_target_modules),
         "model.lora_target_modules is empty: name the modules that get adapters, or [all-linear]")
    unknown = [x for x in run.loggers if x not in LOGGERS]
    need(not unknown, f"trainer.loggers: unknown {unknown}; valid: {', '.join(LOGGERS)}")
    check_choice(run.val_sampled, VAL_SAMPLED, "trainer.val_sampled")


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={device!r} but no CUDA device is available")
    return device


def model_max_positions(model_path: str) -> int | None:
    cfg = Path(model_path) / "config.json"
    if not cfg.exists():
        return None
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{cfg}: not valid JSON ({exc})") from None
    return data.get("max_position_embeddings") if isinstance(data, dict) else None


def check_model_path(path: str, key: str) -> None:
    need(bool(path), f"{key} is required (a local Hugging Face model folder)")
    need(not Path(path).is_file(), f"{key}={path!r} is a file; give the model folder that holds it")
    need(Path(path).is_dir(), f"{key}={path!r}: no such folder")
    need((Path(path) / "config.json").exists(), f"{key}={path!r}: not a Hugging Face model folder (no config.json)")


def check_batch_sizes(batch: int, mini: int, micro: int, section: str) -> tuple[int, int]:
    """Returns the effective (mini, micro) sizes. A mini-batch of 0 means the whole batch; a
    micro-batch larger than the mini-batch is capped to it."""
    mini = mini or batch
    micro = min(micro, mini)
    need(mini > 0 and batch % mini == 0,
         f"{section}.mini_batch_size={mini} must divide the batch of data.train_batch_size * rollout.n = {batch}")
    need(micro > 0 and mini % micro == 0,
         f"{section}.micro_batch_size={micro} must divide {section}.mini_batch_size={mini}")
    return mini, micro


IN_MEMORY_PREFIX = "python:"


def check_data_files(train_files: Sequence[str], others: Optional[dict[str, Sequence[str]]] = None,
                     kind: str = "parquet/JSONL file") -> None:
    """data.train_files must be non-empty, and every file it and `others` ({dotted key: files})
    list must exist."""
    need(bool(train_files), f"data.train_files is empty: give at least one {kind}")
    for key, files in {"data.train_files": train_files, **(others or {})}.items():
        for i, f in enumerate(files):
            if str(f).startswith(IN_MEMORY_PREFIX):  # rows handed to the trainer in Python (trainers/inputs.py)
                continue
            if is_dataset_source(str(f)):  # hf://datasets/... or a save_to_disk folder (data/hf_datasets.py)
                continue
            need(Path(f).exists(), f"{key}[{i}]={f!r}: data file does not exist")
            need(Path(f).is_file(), f"{key}[{i}]={f!r} is a folder; give the {kind}s in it")


REWARD_KEYS = ("name", "weight", "style")
REWARD_STYLES = ("auto", "reinforge", "verl", "trl")  # reinforge.rewards.styles.STYLES, and auto (detect)


def normalize_reward_functions(functions, key: str) -> list[dict]:
    """Reward functions in their full form, [{"name": str, "weight": float}] plus "style" where
    given: a plain string (`reward.functions=[file.py:fn]`) stands for {name: string, weight: 1.0}.
    Each entry needs a non-empty name and a finite weight; `style` (auto, reinforge, verl, trl)
    forces how the function is called; any other key is refused with a did-you-mean."""
    out = []
    for i, item in enumerate(functions):
        at = f"{key}[{i}]"
        entry = {"name": item} if isinstance(item, str) else item
        need(isinstance(entry, dict), f"{at}={item!r}: give a name ('exact_match', 'file.py:fn') or "
                                      "{name: ..., weight: ...}")
        for k in entry:
            close = did_you_mean(k, REWARD_KEYS, f"{at}.")
            need(k in REWARD_KEYS, f"{at}.{k}: unknown key; " + (close.strip() or f"valid keys: {', '.join(REWARD_KEYS)}"))
        if "style" in entry:
            check_choice(entry["style"], REWARD_STYLES, f"{at}.style")
        name, weight = entry.get("name"), entry.get("weight", 1.0)
        need(isinstance(name, str) and bool(name.strip()),
             f"{at}.name={name!r}: give a built-in name, 'module:fn' or 'file.py:fn'")
        need(isinstance(weight, (int, float)) and not isinstance(weight, bool) and math.isfinite(weight),
             f"{at}.weight={weight!r} must be a finite number")
        out.append({"name": name.strip(), "weight": float(weight),
                    **({"style": entry["style"]} if entry.get("style") not in (None, "auto") else {})})
    return out


def validate_supervised(cfg, num_train_examples: Optional[int] = None) -> None:
    """The checks and derived values SFT, DPO and RM share, after their own checks: the optim
    section, batch sizes, max_length and step budget; fills cfg.derived with device,
    micro_batch_size and (once the data size is known) total_steps."""
    d, o, t = cfg.data, cfg.optim, cfg.trainer
    check_adamw(o, "optim")
    check_model_and_run(cfg.model, t)
    need(t.total_steps > 0 or t.epochs > 0, "set trainer.total_steps > 0 or trainer.epochs > 0")
    e = getattr(cfg, "eval", None)
    if e is not None and e.prompt_files:  # generation from eval prompts must fit the model's positions
        max_pos, total = model_max_positions(cfg.model.path), e.max_prompt_length + e.max_response_length
        need(max_pos is None or total <= max_pos,
             f"eval.max_prompt_length + eval.max_response_length = {total} exceeds the model's "
             f"max_position_embeddings = {max_pos}")
    cfg.derived["device"] = resolve_device(t.device)
    cfg.derived["micro_batch_size"] = min(o.micro_batch_size, d.batch_size)
    if num_train_examples is not None:
        cfg.derived["total_steps"] = t.total_steps or max(1, int(t.epochs * num_train_examples / d.batch_size))


def check_teacher(cfg: RLConfig) -> bool:
    """The teacher section's rules (on-policy distillation); returns whether a teacher runs."""
    from reinforge.algos.distill import DISTILL_MODES

    t, r = cfg.teacher, cfg.rollout
    if t.coef == 0:
        need(not t.path, f"teacher.path={t.path!r} is set but teacher.coef=0: set teacher.coef > 0 to distill "
                         "(or use --config distill), or drop teacher.path")
        return False
    need(bool(t.path), f"teacher.coef={t.coef} distills from a teacher: teacher.path is required "
                       "(the teacher's model folder, e.g. teacher.path=runs/demo/grpo/hf)")
    check_model_path(t.path, "teacher.path")
    check_choice(t.mode, DISTILL_MODES, "teacher.mode")
    need(cfg.trainer.backend == "local", "teacher.coef > 0 (distillation) runs with trainer.backend=local only: "
                                         "the teacher is not sharded over Ray ranks")
    if t.mode == "gkd":  # the JSD runs over the whole vocabulary, inside the actor's update
        need(r.top_k == 0 and r.top_p == 1.0, f"teacher.mode=gkd compares whole distributions: rollout.top_k="
                                              f"{r.top_k} and rollout.top_p={r.top_p} must be 0 and 1")
        need(not cfg.model.use_packing, "teacher.mode=gkd does not run with model.use_packing=true")
    return True


def check_agent(r) -> None:
    """The agent loop's keys (rollout.max_turns, tools, tool_parser, env): names are resolved
    (imported) by the preflight, which builds no model either."""
    from reinforge.agents.parsers import PARSERS

    check_name(r.tool_parser, tuple(PARSERS), "rollout.tool_parser")
    if r.max_turns == 1:
        need(not r.tools and not r.env, f"rollout.tools / rollout.env are used by the agent loop: set "
                                        f"rollout.max_turns > 1 (got {r.max_turns}), or drop them")
        return
    need(not (r.tools and r.env), "rollout.tools and rollout.env: an episode either calls tools or talks to "
                                  "an environment; set one of them")
    need(not r.ignore_eos, f"rollout.ignore_eos: EOS ends an agent turn (rollout.max_turns={r.max_turns}); "
                           f"set rollout.ignore_eos=false")


def validate(cfg: RLConfig) -> RLConfig:
    """Check `cfg` and fill `cfg.derived`. Returns the same object."""
    from reinforge.algos import advantages, kl

    a, r, act, crit = cfg.algorithm, cfg.rollout, cfg.actor, cfg.critic
    check_ranges(cfg)
    check_model_path(cfg.model.path, "model.path")
    check_data_files(cfg.data.train_files, {"data.val_files": cfg.data.val_files})
    check_entries(cfg)  # the registry names (did-you-mean) and each selected entry's params rules
    for key, name in (("actor.kl_loss_type", act.kl_loss_type), ("algorithm.kl_penalty", a.kl_penalty)):
        # kl_penalty(..., "full") takes (B, T, V) log-prob rows; the trainer holds (B, T).
        need(name != "full", f"{key}='full' needs log-probs over the whole vocabulary; the trainer has the "
                             f"sampled tokens' only: use k1, k2, k3, abs, k1+ or k3+")
    check_name(a.kl_ctrl, kl.KL_CONTROLLERS, "algorithm.kl_ctrl")
    from reinforge.workers.rollout import check_rollout_backend, check_rollout_device

    check_rollout_backend(r.backend, staleness=r.staleness, max_turns=r.max_turns)  # the registry's names and capabilities
    check_name(cfg.trainer.backend, ("local", "ray"), "trainer.backend")
    if r.staleness > 0:  # the producer thread runs on a copy of the local actor
        need(cfg.trainer.backend == "local", f"rollout.staleness={r.staleness} runs with trainer.backend=local only; "
                                             f"with trainer.backend=ray set rollout.staleness=0")
    check_agent(r)
    check_name(cfg.data.overlong_prompt, OVERLONG_POLICIES, "data.overlong_prompt")
    if a.adv_estimator in advantages.NEEDS_GROUPS:
        need(r.n >= 2, f"algorithm.adv_estimator={a.adv_estimator!r} compares samples within a group: "
                       f"rollout.n={r.n} must be >= 2")
    need(not a.dynamic_sampling or r.n >= 2,
         f"algorithm.dynamic_sampling keeps groups whose rewards differ: rollout.n={r.n} must be >= 2")
    check_adamw(act, "actor")
    check_model_and_run(cfg.model, cfg.trainer)
    max_pos = model_max_positions(cfg.model.path)
    total = cfg.data.max_prompt_length + r.max_response_length
    need(max_pos is None or total <= max_pos,
         f"data.max_prompt_length + rollout.max_response_length = {total} exceeds the model's "
         f"max_position_embeddings = {max_pos}")
    batch = cfg.data.train_batch_size * r.n
    d = cfg.derived
    d["batch_size"] = batch
    d["actor_mini_batch_size"], d["actor_micro_batch_size"] = check_batch_sizes(
        batch, act.mini_batch_size, act.micro_batch_size, "actor")
    d["critic_enabled"] = a.adv_estimator in advantages.NEEDS_VALUES or a.value_pretrain_steps > 0
    if d["critic_enabled"]:
        d["critic_mini_batch_size"], d["critic_micro_batch_size"] = check_batch_sizes(
            batch, crit.mini_batch_size, crit.micro_batch_size, "critic")
        check_adamw(crit, "critic")
        if crit.model_path:
            check_model_path(crit.model_path, "critic.model_path")
    d["reference_enabled"] = bool(act.use_kl_loss or a.use_kl_in_reward)
    d["teacher_enabled"] = check_teacher(cfg)
    d["loss_norm_const"] = act.loss_norm_const or r.max_response_length
    d["device"] = resolve_device(cfg.trainer.device)
    check_rollout_device(r.backend, d["device"])  # vLLM: a CUDA GPU and the package
    cfg.reward.functions = normalize_reward_functions(cfg.reward.functions, "reward.functions")
    need(bool(cfg.reward.functions) or cfg.reward.reward_model_path or (r.max_turns > 1 and r.env),
         "reward.functions is empty and reward.reward_model_path is not set: nothing scores the responses")
    from reinforge.rewards.shaping import check_shaping  # each shaping term checks its own keys

    check_shaping(cfg.reward, a, r.max_response_length)
    check_judge(cfg.reward)
    return cfg


def check_judge(rw) -> None:
    """The reward.judge section, when reward.functions names `judge`: a model folder, a mode, two
    distinct verdicts and a template whose placeholders are known."""
    from reinforge.rewards.judge import JUDGE_MODES, JUDGE_NAME, check_template

    used = any(f["name"] == JUDGE_NAME for f in rw.functions)
    need(not any(f["name"] == JUDGE_NAME and "style" in f for f in rw.functions),
         f"reward.functions: the '{JUDGE_NAME}' entry takes no style (it is called as a batched reinforge function)")
    j = rw.judge
    if not used:
        need(not j.model_path, f"reward.judge.model_path is set but no reward.functions entry is "
                               f"'{JUDGE_NAME}': add {{name: {JUDGE_NAME}, weight: 1.0}} to use the judge")
        return
    need(bool(j.model_path), f"reward.functions names '{JUDGE_NAME}': set reward.judge.model_path to the "
                             "judge's causal-LM folder")
    check_model_path(j.model_path, "reward.judge.model_path")
    check_choice(j.mode, JUDGE_MODES, "reward.judge.mode")
    verdicts = list(j.verdicts)
    need(not any(isinstance(v, bool) for v in verdicts),
         f"reward.judge.verdicts={verdicts!r}: YAML reads Yes/No/On/Off as booleans; quote the verdicts, "
         """e.g. 'reward.judge.verdicts=["Yes", "No"]'""")
    need(len(verdicts) == 2 and all(isinstance(v, str) and v for v in verdicts) and verdicts[0] != verdicts[1],
         f"reward.judge.verdicts={verdicts!r}: give two different non-empty strings, [positive, negative]")
    try:
        check_template(j.template)
    except ValueError as exc:
        raise ConfigError(f"reward.judge.template: {exc}") from None
    max_pos = model_max_positions(j.model_path)
    new = j.max_new_tokens if j.mode == "generate" else 0
    longest = (j.max_length or 1) + new  # max_length 0: whatever the judge's positions leave, at least 1
    need(max_pos is None or longest <= max_pos,
         f"reward.judge.max_length + reward.judge.max_new_tokens = {longest} exceeds the judge's "
         f"max_position_embeddings = {max_pos}")
