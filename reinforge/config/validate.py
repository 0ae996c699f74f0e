"""The rules about a config's values, before any model loads: `validate` for RL, and the rules
the supervised trainers (SFT, DPO, RM) share. Nothing here changes the config.

Each rule fails with one ConfigError naming the keys involved and the rule broken. Rules that
need names from the layers above config (data formats, rollout backends, tool parsers, reward
shaping, the judge) are trainers/preflight.py's; the values derived from a config (batch
sizes, device, which roles run) are trainers/plan.py's.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Sequence

from reinforge.config.common import AdamWConfig
from reinforge.config.hints import did_you_mean
from reinforge.config.load import ConfigError
from reinforge.config.ranges import check_ranges
from reinforge.config.registries import check_entries
from reinforge.config.schema import RLConfig

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
    check_choice(model.autocast, ("none", "bf16", "auto"), "model.autocast")
    check_choice(str(model.gradient_checkpointing).lower(), ("auto", "true", "false"), "model.gradient_checkpointing")
    check_choice(model.attn_implementation, ATTN_IMPLEMENTATIONS, "model.attn_implementation")
    need(model.lora_rank == 0 or bool(model.lora_target_modules),
         "model.lora_target_modules is empty: name the modules that get adapters, or [all-linear]")
    need(isinstance(model.freeze_vision_tower, bool),
         f"model.freeze_vision_tower={model.freeze_vision_tower!r} must be true or false")
    need(model.freeze_vision_tower or model.lora_rank == 0,
         "model.freeze_vision_tower=false asks to train the vision tower, but with model.lora_rank > 0 only the "
         "adapters train (they go on the language model): set model.lora_rank=0 or model.freeze_vision_tower=true")
    unknown = [x for x in run.loggers if x not in LOGGERS]
    need(not unknown, f"trainer.loggers: unknown {unknown}; valid: {', '.join(LOGGERS)}")
    check_choice(run.val_sampled, VAL_SAMPLED, "trainer.val_sampled")


def model_max_positions(model_path: str) -> int | None:
    cfg = Path(model_path) / "config.json"
    if not cfg.exists():
        return None
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{cfg}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        return None
    text = data.get("text_config")  # a vision-language model's language model
    return data.get("max_position_embeddings") or (text.get("max_position_embeddings") if isinstance(text, dict) else None)


def check_model_path(path: str, key: str) -> None:
    need(bool(path), f"{key} is required (a local Hugging Face model folder)")
    need(not Path(path).is_file(), f"{key}={path!r} is a file; give the model folder that holds it")
    need(Path(path).is_dir(), f"{key}={path!r}: no such folder")
    need((Path(path) / "config.json").exists(), f"{key}={path!r}: not a Hugging Face model folder (no config.json)")


def check_batch_sizes(batch: int, mini: int, micro: int, section: str) -> tuple[int, int]:
    """Returns the effective (mini, micro) sizes. A mini-batch of 0 means the whole batch; a
    micro-batch larger than the mini-batch is capped to it; a micro-batch of 0 (auto, the actor's)
    stays 0 for the plan to choose (models/shape_defaults.resolve_memory)."""
    mini = mini or batch
    micro = min(micro, mini)
    need(mini > 0 and batch % mini == 0,
         f"{section}.mini_batch_size={mini} must divide the batch of data.train_batch_size * rollout.n = {batch}")
    need(micro == 0 or mini % micro == 0,
         f"{section}.micro_batch_size={micro} must divide {section}.mini_batch_size={mini}")
    return mini, micro


IN_MEMORY_PREFIX = "python:"


REWARD_KEYS = ("name", "weight", "style")


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
        # a forced `style` is checked against the registered styles by trainers/preflight.py
        name, weight = entry.get("name"), entry.get("weight", 1.0)
        need(isinstance(name, str) and bool(name.strip()),
             f"{at}.name={name!r}: give a built-in name, 'module:fn' or 'file.py:fn'")
        need(isinstance(weight, (int, float)) and not isinstance(weight, bool) and math.isfinite(weight),
             f"{at}.weight={weight!r} must be a finite number")
        out.append({"name": name.strip(), "weight": float(weight),
                    **({"style": entry["style"]} if entry.get("style") not in (None, "auto") else {})})
    return out


def validate_supervised(cfg, eval_cfg=None) -> None:
    """The rules SFT, DPO and RM share, after their own: the optim section, the model and run
    sections, the step budget and (`eval_cfg`, SFT's and DPO's eval section) the generation
    lengths against the model's positions."""
    o, t = cfg.optim, cfg.trainer
    check_adamw(o, "optim")
    check_model_and_run(cfg.model, t)
    need(t.total_steps > 0 or t.epochs > 0, "set trainer.total_steps > 0 or trainer.epochs > 0")
    if eval_cfg is not None and eval_cfg.prompt_files:  # generation from eval prompts must fit the model's positions
        max_pos, total = model_max_positions(cfg.model.path), eval_cfg.max_prompt_length + eval_cfg.max_response_length
        need(max_pos is None or total <= max_pos,
             f"eval.max_prompt_length + eval.max_response_length = {total} exceeds the model's "
             f"max_position_embeddings = {max_pos}")


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
    """The agent loop's keys (rollout.max_turns, tools, tool_parser, env); the parser's name and
    the tools and environment are resolved by the preflight, which builds no model either."""
    if r.max_turns == 1:
        need(not r.tools and not r.env, f"rollout.tools / rollout.env are used by the agent loop: set "
                                        f"rollout.max_turns > 1 (got {r.max_turns}), or drop them")
        return
    need(not (r.tools and r.env), "rollout.tools and rollout.env: an episode either calls tools or talks to "
                                  "an environment; set one of them")
    need(not r.ignore_eos, f"rollout.ignore_eos: EOS ends an agent turn (rollout.max_turns={r.max_turns}); "
                           f"set rollout.ignore_eos=false")


def check_agent_gateway(cfg: RLConfig) -> None:
    """rollout.agent (the model gateway, reinforge.gateway): the run shapes it serves. The agent
    itself is imported by the preflight, which builds no model either."""
    r = cfg.rollout
    if not r.agent:
        return
    need(r.max_turns == 1 and not r.tools and not r.env,
         "rollout.agent runs its own loop: drop rollout.max_turns / rollout.tools / rollout.env")
    if r.staleness > 0:  # the producer drives the agents on the behaviour copy (trainers/async_rollout.py;
        # on Ray each rollout worker serves its share's agents: distributed/rollout_workers.py)
        need(r.schedule == "timing", "rollout.agent with rollout.staleness > 0: rollout.schedule=timing only (agents "
                                     "running concurrently make no deterministic schedule); set rollout.schedule=timing")
        need(not r.partial, "rollout.agent with rollout.staleness > 0: rollout.partial=false (the behaviour weights "
                            "change between chunks only); set rollout.partial=false")
    need(not r.ignore_eos, "rollout.agent: EOS ends a model call; set rollout.ignore_eos=false")
    check_choice(r.agent_history, ("split", "drop"), "rollout.agent_history")
    need(r.agent_concurrency >= 1, f"rollout.agent_concurrency={r.agent_concurrency} must be >= 1")
    need(r.agent_timeout_s > 0, f"rollout.agent_timeout_s={r.agent_timeout_s} must be > 0")


def check_router_replay(cfg: RLConfig) -> None:
    """actor.router_replay=rollout (models/moe.py) needs a rollout that records the experts per
    token and a forward whose tokens line up with them: the lean loop, in this process, single
    turn, padded (not packed) rows. Whether the model is an MoE is checked with its files
    (trainers/preflight.check_moe_rl)."""
    act, r = cfg.actor, cfg.rollout
    check_choice(act.router_replay, ("disabled", "rollout"), "actor.router_replay")
    if act.router_replay == "disabled":
        return
    why = "actor.router_replay=rollout"
    need(r.backend == "lean", f"{why} needs the lean rollout, which records the experts (got rollout.backend={r.backend})")
    need(cfg.trainer.backend == "local", f"{why} runs on trainer.backend=local only (the Ray ranks' rollout "
                                         f"copies do not record the experts yet)")
    need(r.max_turns == 1 and not r.agent, f"{why} runs single-turn rollouts only (the agent loop's turns are "
                                           f"not recorded); set rollout.max_turns=1 and no rollout.agent")
    need(not cfg.model.use_packing, f"{why} replays per padded row; set model.use_packing=false")


def validate(cfg: RLConfig) -> RLConfig:
    """Check the rules about `cfg`'s values; returns it unchanged (trainers/plan.py derives the
    plan from it)."""
    from reinforge.algos import advantages, kl

    a, r, act, crit = cfg.algorithm, cfg.rollout, cfg.actor, cfg.critic
    check_ranges(cfg)
    check_model_path(cfg.model.path, "model.path")
    check_entries(cfg)  # the registry names (did-you-mean) and each selected entry's params rules
    for key, name in (("actor.kl_loss_type", act.kl_loss_type), ("algorithm.kl_penalty", a.kl_penalty)):
        # kl_penalty(..., "full") takes (B, T, V) log-prob rows; the trainer holds (B, T).
        need(name != "full", f"{key}='full' needs log-probs over the whole vocabulary; the trainer has the "
                             f"sampled tokens' only: use k1, k2, k3, abs, k1+ or k3+")
    check_name(a.kl_ctrl, kl.KL_CONTROLLERS, "algorithm.kl_ctrl")
    check_name(cfg.trainer.backend, ("local", "ray"), "trainer.backend")
    check_choice(r.dtype, ("auto", "model", "bfloat16", "float16"), "rollout.dtype")
    need(r.dtype in ("auto", "model") or r.backend == "lean",
         f"rollout.dtype={r.dtype} is the lean backend's (got rollout.backend={r.backend}); set rollout.dtype=model")
    check_choice(r.schedule, ("timing", "deterministic"), "rollout.schedule")
    need(not r.partial or r.staleness > 0, "rollout.partial=true interrupts the asynchronous producer's "
                                           "generations: set rollout.staleness >= 1 (or rollout.partial=false)")
    need(not r.partial or r.max_turns == 1, f"rollout.partial=true runs single-turn rollouts only (got "
                                            f"rollout.max_turns={r.max_turns}); set rollout.partial=false")
    need(not r.partial or r.dtype in ("auto", "model"), f"rollout.partial=true swaps the weights the lean loop "
                                                        f"decodes with; rollout.dtype={r.dtype} decodes from a copy: "
                                                        f"set rollout.dtype=model")
    check_agent(r)
    check_agent_gateway(cfg)
    check_router_replay(cfg)
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
    check_batch_sizes(batch, act.mini_batch_size, act.micro_batch_size, "actor")
    if critic_enabled(cfg):
        check_batch_sizes(batch, crit.mini_batch_size, crit.micro_batch_size, "critic")
        check_adamw(crit, "critic")
        if crit.model_path:
            check_model_path(crit.model_path, "critic.model_path")
    check_teacher(cfg)
    check_sequence_parallel(cfg)
    functions = normalize_reward_functions(cfg.reward.functions, "reward.functions")
    need(bool(functions) or cfg.reward.reward_model_path or (r.max_turns > 1 and r.env) or r.agent,
         "reward.functions is empty and reward.reward_model_path is not set: nothing scores the responses")
    return cfg


def sequence_parallel_heads_rule(num_heads: int, num_kv_heads: int, k: int) -> str | None:
    """The refusal of a model whose heads do not split over k sequence-parallel ranks, or None."""
    if num_heads % k or num_kv_heads % k:
        return (f"trainer.sequence_parallel={k} must divide the attention heads ({num_heads}) and the key/value "
                f"heads ({num_kv_heads}): the Ulysses all-to-all gives each rank heads / k of both")
    return None


def check_sequence_parallel(cfg: RLConfig) -> None:
    """trainer.sequence_parallel=k (models/seq_parallel.py): a Ray run whose ranks split into groups
    of k, sdpa attention, text models whose heads (and key/value heads) k divides, and no pass
    that runs its own forward outside the split (the optimal token baseline's sum pi^2)."""
    from reinforge.algos.advantages import NEEDS_TOKEN_STATS

    k, t = cfg.trainer.sequence_parallel, cfg.trainer
    if k == 1:
        return
    world = t.nnodes * t.devices_per_node
    need(t.backend == "ray", f"trainer.sequence_parallel={k} splits rows over Ray ranks: set trainer.backend=ray "
                             f"(got {t.backend!r})")
    need(world % k == 0, f"trainer.sequence_parallel={k} must divide the data-parallel world size "
                         f"trainer.nnodes * trainer.devices_per_node = {world}")
    need(cfg.model.attn_implementation == "sdpa",
         f"trainer.sequence_parallel={k} wraps sdpa attention: set model.attn_implementation=sdpa")
    need(cfg.algorithm.adv_estimator not in NEEDS_TOKEN_STATS,
         f"trainer.sequence_parallel={k} does not compute sum pi^2 (algorithm.adv_estimator="
         f"{cfg.algorithm.adv_estimator!r})")
    paths = [("model.path", cfg.model.path)]
    if critic_enabled(cfg) and cfg.critic.model_path:
        paths.append(("critic.model_path", cfg.critic.model_path))
    for key, path in paths:
        file = Path(path) / "config.json"
        data = json.loads(file.read_text(encoding="utf-8")) if file.exists() else {}
        need("vision_config" not in data, f"trainer.sequence_parallel={k} takes text models; {key}={path!r} "
                                          f"is a vision-language model")
        need(not data.get("use_sliding_window") and "sliding_attention" not in (data.get("layer_types") or []),
             f"trainer.sequence_parallel={k} builds each row's full causal mask: {key}={path!r} uses "
             f"sliding-window attention")
        heads = data.get("num_attention_heads")
        if heads:
            rule = sequence_parallel_heads_rule(heads, data.get("num_key_value_heads") or heads, k)
            need(rule is None, f"{key}={path!r}: {rule}")


def critic_enabled(cfg: RLConfig) -> bool:
    """Whether a critic is trained: the estimator needs values, or value pretraining is asked for."""
    from reinforge.algos.advantages import NEEDS_VALUES

    return cfg.algorithm.adv_estimator in NEEDS_VALUES or cfg.algorithm.value_pretrain_steps > 0
