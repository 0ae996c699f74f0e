"""The run, resolved once into a frozen plan before any model or worker is built.

    plan = resolve(cfg, rows)              # RL: RunPlan
    plan = resolve_supervised(cfg, rows)   # SFT, DPO, RM: SupervisedPlan
    plan = plan.with_data(len(train))      # SFT, DPO, RM: total_steps once the data is read

`resolve` never changes `cfg`: Hub ids among the model paths are resolved into a copy
(models/hub.py), the copy's rules are checked (config/validate.py for the values,
trainers/preflight.py for the names that live in higher layers), the values the trainer needs
are derived (batch sizes, device, which roles run, on-policy or not, truncated IS), and then
every file the plan names is checked (preflight). `plan.cfg` is that resolved copy, which the
trainer and the builders read; a run's config.yaml is `plan.to_dict()`: the copy, and the
derived values under `derived:` (config/load.py reads that section back as nothing).
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from reinforge.config.load import DERIVED_KEY, ConfigError
from reinforge.config.preference import DPOConfig, RMConfig, resolve_preference, validate_preference
from reinforge.config.schema import RLConfig
from reinforge.config.sft import SFTConfig, validate_sft
from reinforge.config.validate import check_batch_sizes, critic_enabled, normalize_reward_functions, validate
from reinforge.data.preference import PREF_OVERLONG
from reinforge.data.sft import SFT_OVERLONG
from reinforge.models.hub import resolve_model_paths
from reinforge.trainers import preflight

# config.json keys that put dropout into a causal LM's forward (train mode != eval mode). The
# classification heads' dropout (classifier_, summary_) is not part of a causal LM.
HEAD_DROPOUT = ("classifier_", "summary_")


@dataclass(frozen=True)
class RunPlan:
    """What an RL run is, derived once from its config: what the trainer and builders read."""
    cfg: RLConfig
    """The resolved copy of the config: Hub ids replaced by snapshot folders, reward functions in
    their full form, Python inputs named (trainers/inputs.py)."""
    device: str
    """Where the models go: trainer.device with `auto` resolved (a Ray rank's own plan: its device)."""
    batch_size: int
    """Sequences per step: data.train_batch_size * rollout.n."""
    actor_mini_batch_size: int
    """Sequences per actor optimizer step (actor.mini_batch_size, 0 = the whole batch)."""
    actor_micro_batch_size: int
    """Sequences per actor forward/backward (capped to the mini-batch)."""
    critic_mini_batch_size: Optional[int]
    """Sequences per critic optimizer step; None without a critic."""
    critic_micro_batch_size: Optional[int]
    """Sequences per critic forward/backward; None without a critic."""
    critic_enabled: bool
    """A critic is trained: the estimator needs values, or value pretraining is asked for."""
    reference_enabled: bool
    """A reference model scores the samples: a KL loss or a KL penalty in the reward."""
    teacher_enabled: bool
    """A distillation teacher scores the samples (teacher.coef > 0)."""
    on_policy: bool
    """The actor's update takes its one step at the rollout weights (one epoch, one mini-batch, no
    dropout) and nothing reads old log-probs before it: the old-log-prob pass is skipped."""
    tis_cap: Optional[float]
    """Truncated importance sampling's cap (rollout.tis_cap) when the samples come from another
    engine, precision or older weights (rollout.backend=vllm, rollout.dtype other than the
    weights', rollout.staleness > 0); None otherwise."""
    rollout_backend: str
    """The generation backend: lean, hf or vllm (rollout.backend)."""
    loss_norm_const: float
    """seq-mean-token-sum-norm's constant: actor.loss_norm_const, or rollout.max_response_length."""
    hub_ids: dict = field(default_factory=dict)
    """{dotted key: the Hub id it held} for the model paths resolved to cache snapshots."""
    model_folders: dict = field(default_factory=dict)
    """{dotted key: folder} of every model the run loads (policy, critic, reward model, judge, teacher)."""
    reward_functions: tuple = ()
    """(dotted key, spec, forced style or None) of each reward.functions entry (`judge` among them)."""
    rows: dict = field(default_factory=dict)
    """Datasets handed over in Python, by the `python:` names the data keys hold."""
    autocast: str = "none"
    """model.autocast with `auto` resolved (models/shape_defaults.py); cfg.model holds it too."""
    rollout_dtype: str = "model"
    """rollout.dtype with `auto` resolved; cfg.rollout holds it too."""
    gradient_checkpointing: bool = False
    """model.gradient_checkpointing with `auto` resolved against the memory budget
    (models/shape_defaults.resolve_memory); cfg.model holds it too, as "true" / "false"."""
    memory: str = ""
    """The estimate the micro-batch and checkpointing were chosen by (shape_defaults.MemoryPlan.line)."""
    logprob_path: str = ""
    """How the actor's log-probs are computed: fused (chunk rows, bf16 head) or logits (logprob_path)."""

    RECORDED = ("batch_size", "actor_mini_batch_size", "actor_micro_batch_size", "critic_enabled",
                "critic_mini_batch_size", "critic_micro_batch_size", "reference_enabled", "teacher_enabled",
                "loss_norm_const", "device", "on_policy", "tis_cap", "rollout_backend", "autocast", "rollout_dtype",
                "gradient_checkpointing", "memory", "logprob_path")

    def record(self) -> dict:
        """The derived values written under `derived:` in config.yaml."""
        out = {k: getattr(self, k) for k in self.RECORDED}
        if not self.critic_enabled:
            del out["critic_mini_batch_size"], out["critic_micro_batch_size"]
        return {**out, **({"hub_ids": dict(self.hub_ids)} if self.hub_ids else {})}

    def to_dict(self) -> dict:
        """The resolved config, plus the derived values under `derived:` (config.yaml)."""
        return {**self.cfg.to_dict(), DERIVED_KEY: self.record()}


@dataclass(frozen=True)
class SupervisedPlan:
    """What an SFT, DPO or RM run is, derived once from its config."""
    cfg: Any
    """The resolved copy of the config (SFTConfig, DPOConfig or RMConfig): Hub ids replaced by
    snapshot folders, eval reward functions in their full form, Python inputs named."""
    device: str
    """Where the models go: trainer.device with `auto` resolved."""
    micro_batch_size: int
    """Rows (pairs) per forward/backward: optim.micro_batch_size capped to data.batch_size."""
    gradient_checkpointing: bool = False
    """model.gradient_checkpointing with `auto` resolved (as for RL: shape_defaults.resolve_memory)."""
    total_steps: Optional[int] = None
    """Optimizer steps: trainer.total_steps, or trainer.epochs over the data; None until the data
    size is known (with_data)."""
    hub_ids: dict = field(default_factory=dict)
    """{dotted key: the Hub id it held} for the model paths resolved to cache snapshots."""
    model_folders: dict = field(default_factory=dict)
    """{dotted key: folder} of every model the run loads (the policy, DPO's reference)."""
    reward_functions: tuple = ()
    """(dotted key, spec, forced style or None) of each eval reward function."""
    rows: dict = field(default_factory=dict)
    """Datasets handed over in Python, by the `python:` names the data keys hold."""

    def with_data(self, num_train_examples: int) -> "SupervisedPlan":
        """This plan with total_steps fixed by the number of training examples (rows or pairs)."""
        d, t = self.cfg.data, self.cfg.trainer
        return replace(self, total_steps=t.total_steps or max(1, int(t.epochs * num_train_examples / d.batch_size)))

    def record(self) -> dict:
        """The derived values written under `derived:` in config.yaml."""
        out = {"device": self.device, "micro_batch_size": self.micro_batch_size,
               "gradient_checkpointing": self.gradient_checkpointing}
        if self.total_steps is not None:
            out["total_steps"] = self.total_steps
        return {**out, **({"hub_ids": dict(self.hub_ids)} if self.hub_ids else {})}

    def to_dict(self) -> dict:
        """The resolved config, plus the derived values under `derived:` (config.yaml)."""
        return {**self.cfg.to_dict(), DERIVED_KEY: self.record()}


# ---- RL ---------------------------------------------------------------------------------------
def resolve(cfg: RLConfig, rows: dict | None = None) -> RunPlan:
    """The RL run's plan: Hub ids resolved into a copy of `cfg`, its rules checked, its values
    derived (plan_rl), then every file it names checked (preflight), all before any model
    loads. `rows`: datasets handed over in Python (trainers/inputs.py). `cfg` is not changed."""
    resolved, hub_ids = resolve_model_paths(cfg)
    plan = plan_rl(resolved, hub_ids=hub_ids, rows=rows)
    preflight.check_rl_files(plan)
    return plan


def resolve_shape_defaults(cfg: RLConfig, device: str) -> RLConfig:
    """`cfg` with model.autocast and rollout.dtype `auto` resolved by the model's size (from its
    config.json) and the device (models/shape_defaults.py): off below 100M parameters."""
    from reinforge.models.shape_defaults import config_params, resolve_autocast, resolve_rollout_dtype

    m, r = cfg.model, cfg.rollout
    if "auto" not in (m.autocast, r.dtype):
        return cfg
    n = config_params(m.path)
    return replace(cfg, model=replace(m, autocast=resolve_autocast(m.autocast, n, device)),
                   rollout=replace(r, dtype=resolve_rollout_dtype(r.dtype, n, device, r.backend, m.dtype)))


def _weights_bytes(dtype: str, device: str) -> int:
    """Bytes per parameter of model.dtype on `device` (auto: fp32 on a CPU, bf16 on a GPU)."""
    if dtype == "auto":
        return 2 if device.startswith("cuda") else 4
    return 4 if dtype == "float32" else 2


def resolve_actor_memory(cfg: RLConfig, device: str, mini: int, micro: int, reference: bool):
    """(cfg with model.gradient_checkpointing "true" / "false" and actor.micro_batch_size set,
    shape_defaults.MemoryPlan): both chosen against model.memory_budget_gb from config.json."""
    from reinforge.models.shape_defaults import full_attention, resolve_memory

    m, r = cfg.model, cfg.rollout
    share = (m.share_prompt and not m.use_packing and r.n > 1 and cfg.trainer.sequence_parallel == 1
             and full_attention(m.path))
    mem = resolve_memory(ckpt=m.gradient_checkpointing, micro=micro, mini=mini,
                         seq=cfg.data.max_prompt_length + cfg.rollout.max_response_length, model_path=m.path,
                         device=device, budget_gb=m.memory_budget_gb, weights_bytes=_weights_bytes(m.dtype, device),
                         bf16_autocast=m.autocast == "bf16", trained_fraction=0.0 if m.lora_rank > 0 else 1.0,
                         reference=reference and m.lora_rank == 0, fused=m.fused_logprobs,
                         eager_attention=m.attn_implementation == "eager",
                         shared=(r.n, cfg.data.max_prompt_length, r.max_response_length) if share else None)
    cfg = replace(cfg, model=replace(m, gradient_checkpointing="true" if mem.gradient_checkpointing else "false"),
                  actor=replace(cfg.actor, micro_batch_size=mem.micro_batch_size))
    return cfg, mem


def resolve_critic_memory(cfg: RLConfig, device: str, mini: int, micro: int, actor_mem) -> tuple[RLConfig, int]:
    """(cfg with critic.micro_batch_size set, that size): critic.micro_batch_size=0 (auto) chosen
    as the actor's is (shape_defaults.resolve_memory) from the critic's config.json, under the
    actor's checkpointing choice (load_critic takes model.gradient_checkpointing), in the budget
    the actor's state (`actor_mem.state_bytes`) leaves; its head is one value per token."""
    from reinforge.models.shape_defaults import resolve_memory

    m = cfg.model
    mem = resolve_memory(ckpt="true" if actor_mem.gradient_checkpointing else "false", micro=micro, mini=mini,
                         seq=cfg.data.max_prompt_length + cfg.rollout.max_response_length,
                         model_path=cfg.critic.model_path or m.path, device=device, budget_gb=m.memory_budget_gb,
                         weights_bytes=_weights_bytes(m.dtype, device), bf16_autocast=False, value_head=True,
                         resident_bytes=actor_mem.state_bytes, eager_attention=m.attn_implementation == "eager")
    return replace(cfg, critic=replace(cfg.critic, micro_batch_size=mem.micro_batch_size)), mem.micro_batch_size


def logprob_path(m) -> str:
    """The actor's log-prob path as the model's vocabulary and model.* choose it: `fused` (chunk
    rows from algos/fused_logprobs.auto_chunk_rows unless model.logprob_chunk_size; bf16 head
    matmuls under bf16 autocast from 65,536 ids) or `logits` (model.fused_logprobs=false; a head
    with a bias also takes it)."""
    from reinforge.algos.fused_logprobs import BF16_HEAD_MIN_VOCAB, auto_chunk_rows
    from reinforge.models.shape_defaults import model_shape

    shape = model_shape(m.path)
    if not m.fused_logprobs:
        return "logits" + (f" (chunk {m.logprob_chunk_size} rows)" if m.logprob_chunk_size else "")
    if shape is None:
        return "fused"
    V = shape["vocab"]
    rows = m.logprob_chunk_size or auto_chunk_rows(V)
    head = "bf16" if m.autocast == "bf16" and V >= BF16_HEAD_MIN_VOCAB and m.dtype in ("auto", "float32") else "model dtype"
    return f"fused, {rows} tokens per chunk at V = {V}, head matmuls in {head}"


def plan_rl(cfg: RLConfig, *, hub_ids: dict | None = None, rows: dict | None = None) -> RunPlan:
    """The rules of `cfg` (whose model paths are folders) and the plan derived from it, on a
    copy; of the files it names it reads only the model's config.json (`reinforge config`)."""
    validate(cfg)
    preflight.check_rl_names(cfg)
    a, r, act, crit = cfg.algorithm, cfg.rollout, cfg.actor, cfg.critic
    device = resolve_device(cfg.trainer.device)
    from reinforge.workers.rollout import check_rollout_device

    check_rollout_device(r.backend, device)  # vLLM: the package, built for this device
    cfg = copy.deepcopy(cfg)
    cfg = replace(cfg, reward=replace(cfg.reward, functions=normalize_reward_functions(cfg.reward.functions,
                                                                                        "reward.functions")))
    cfg = resolve_shape_defaults(cfg, device)
    r = cfg.rollout
    preflight.check_reward_names(cfg.reward, cfg.algorithm, r.max_response_length)
    batch = cfg.data.train_batch_size * r.n
    mini, micro = check_batch_sizes(batch, act.mini_batch_size, act.micro_batch_size, "actor")
    reference = bool(act.use_kl_loss or a.use_kl_in_reward)
    cfg, mem = resolve_actor_memory(cfg, device, mini, micro, reference)
    micro = mem.micro_batch_size
    critic = critic_enabled(cfg)
    c_mini, c_micro = check_batch_sizes(batch, crit.mini_batch_size, crit.micro_batch_size, "critic") \
        if critic else (None, None)
    if critic:
        cfg, c_micro = resolve_critic_memory(cfg, device, c_mini, c_micro, mem)
    teacher = cfg.teacher.coef != 0  # validate checked the teacher section
    # on-policy: the update's own forward gives the old log-probs (workers/actor.py), so the
    # old-log-prob pass is skipped; KL in the reward, distillation and the optimal token baseline
    # (which also needs sum pi^2) read them before the update
    from reinforge.algos.advantages import NEEDS_TOKEN_STATS

    reads_old = a.use_kl_in_reward or teacher or a.adv_estimator in NEEDS_TOKEN_STATS
    on_policy = (not reads_old and act.ppo_epochs == 1 and batch <= mini and not has_dropout(cfg.model.path))
    return RunPlan(
        cfg=cfg, device=device, batch_size=batch, actor_mini_batch_size=mini, actor_micro_batch_size=micro,
        critic_mini_batch_size=c_mini, critic_micro_batch_size=c_micro, critic_enabled=critic,
        reference_enabled=reference, teacher_enabled=teacher,
        on_policy=on_policy,
        tis_cap=r.tis_cap if r.backend == "vllm" or r.staleness > 0 or r.dtype != "model" else None,
        autocast=cfg.model.autocast, rollout_dtype=r.dtype, gradient_checkpointing=mem.gradient_checkpointing,
        memory=mem.line(), logprob_path=logprob_path(cfg.model),
        rollout_backend=r.backend, loss_norm_const=act.loss_norm_const or r.max_response_length,
        hub_ids=dict(hub_ids or {}), model_folders=_rl_model_folders(cfg, critic, teacher),
        reward_functions=tuple((f"reward.functions[{i}].name", f["name"], f.get("style"))
                               for i, f in enumerate(cfg.reward.functions)),
        rows=dict(rows or {}))


def _rl_model_folders(cfg: RLConfig, critic: bool, teacher: bool) -> dict:
    out = {"model.path": cfg.model.path, "critic.model_path": cfg.critic.model_path if critic else None,
           "reward.reward_model_path": cfg.reward.reward_model_path,
           "reward.judge.model_path": cfg.reward.judge.model_path,  # set only when `judge` is used (check_judge)
           "teacher.path": cfg.teacher.path if teacher else None}
    return {k: v for k, v in out.items() if v}


def has_dropout(model_path: str) -> bool:
    """Whether the model folder's config.json puts dropout into the forward: a `*dropout*` or
    `*pdrop` value > 0 (attention_dropout, hidden_dropout, resid_pdrop, ...), as the loaded
    module's nn.Dropout layers and config.attention_dropout would show
    (workers/actor.on_policy_update). A composite model's sub-configs count too: a VLM keeps its
    language model's dropout in `text_config` and its tower's in `vision_config` (any `*_config`
    object). A folder without a readable config.json: none."""
    try:
        data = json.loads((Path(model_path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return _config_has_dropout(data)


def _config_has_dropout(data) -> bool:
    """has_dropout on one config.json object and its `*_config` sub-objects."""
    if not isinstance(data, dict):
        return False
    return any(_config_has_dropout(v) if k.endswith("_config") and isinstance(v, dict) else
               ("dropout" in k or k.endswith("pdrop")) and not k.startswith(HEAD_DROPOUT)
               and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for k, v in data.items())


def resolve_device(device: str) -> str:
    """trainer.device with `auto` resolved; ConfigError for CUDA on a machine without it."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={device!r} but no CUDA device is available")
    return device


# ---- SFT, DPO, RM -----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Supervised:
    """How one supervised config's rules and files are read."""
    rules: Any
    """config/<kind>.py's validate function."""
    data_kind: str
    """What data.train_files holds, for the empty-list message."""
    has_eval: bool
    """The config has an eval section (generation on eval.prompt_files, eval.reward_functions)."""
    overlong: tuple
    """The data.overlong policies its dataset knows."""
    folders: Callable[[Any], dict] = lambda cfg: {"model.path": cfg.model.path}
    """cfg -> {dotted key: folder} of the models the run loads."""
    resolve: Callable[[Any], Any] = lambda cfg: cfg
    """cfg -> a copy with its `auto` settings resolved (DPO: dpo.reduction per loss type)."""


def _dpo_folders(cfg: DPOConfig) -> dict:
    return {"model.path": cfg.model.path, **({"dpo.ref_model_path": cfg.dpo.ref_model_path}
                                             if cfg.dpo.ref_model_path else {})}


SUPERVISED = {SFTConfig: _Supervised(validate_sft, "parquet/JSONL file", True, SFT_OVERLONG),
              DPOConfig: _Supervised(validate_preference, "prompt/chosen/rejected file", True, PREF_OVERLONG,
                                     _dpo_folders, resolve_preference),
              RMConfig: _Supervised(validate_preference, "prompt/chosen/rejected file", False, PREF_OVERLONG)}


def resolve_supervised_checkpointing(cfg, device: str, micro: int, pairs: bool):
    """(cfg with model.gradient_checkpointing "true" / "false", the choice): `auto` against
    model.memory_budget_gb for `micro` rows (pairs: two sequences each) of data.max_length tokens."""
    from reinforge.models.shape_defaults import resolve_memory

    m = cfg.model
    rows = micro * (2 if pairs else 1)
    mem = resolve_memory(ckpt=m.gradient_checkpointing, micro=rows, mini=rows, seq=cfg.data.max_length,
                         model_path=m.path, device=device, budget_gb=m.memory_budget_gb,
                         weights_bytes=_weights_bytes(m.dtype, device), bf16_autocast=False,
                         trained_fraction=0.0 if m.lora_rank > 0 else 1.0, fused=m.fused_logprobs,
                         eager_attention=m.attn_implementation == "eager")
    on = mem.gradient_checkpointing
    return replace(cfg, model=replace(m, gradient_checkpointing="true" if on else "false")), on


def resolve_supervised(cfg, rows: dict | None = None) -> SupervisedPlan:
    """The SFT, DPO or RM run's plan (total_steps still None: `with_data` fixes it once the data
    is read): Hub ids resolved into a copy, its rules checked, then every file it names."""
    resolved, hub_ids = resolve_model_paths(cfg)
    plan = plan_supervised(resolved, hub_ids=hub_ids, rows=rows)
    preflight.check_supervised_files(plan)
    return plan


def plan_supervised(cfg, *, hub_ids: dict | None = None, rows: dict | None = None) -> SupervisedPlan:
    """The rules of `cfg` (SFTConfig, DPOConfig or RMConfig) and the plan derived from it, on a copy."""
    kind = SUPERVISED.get(type(cfg))
    if kind is None:
        raise TypeError(f"not a supervised config: {type(cfg).__name__}")
    kind.rules(cfg)
    preflight.check_supervised_names(cfg, kind.data_kind, cfg.eval.prompt_files if kind.has_eval else None,
                                     kind.overlong)
    device = resolve_device(cfg.trainer.device)
    cfg = kind.resolve(copy.deepcopy(cfg))
    functions: tuple = ()
    if kind.has_eval:
        e = cfg.eval
        cfg = replace(cfg, eval=replace(e, reward_functions=normalize_reward_functions(e.reward_functions,
                                                                                       "eval.reward_functions")))
        preflight.check_reward_styles(cfg.eval.reward_functions, "eval.reward_functions")
        functions = tuple((f"eval.reward_functions[{i}].name", f["name"], f.get("style"))
                          for i, f in enumerate(cfg.eval.reward_functions))
    micro = min(cfg.optim.micro_batch_size, cfg.data.batch_size)
    cfg, checkpointing = resolve_supervised_checkpointing(cfg, device, micro, pairs=kind.data_kind != "parquet/JSONL file")
    return SupervisedPlan(cfg=cfg, device=device, micro_batch_size=micro, gradient_checkpointing=checkpointing,
                          hub_ids=dict(hub_ids or {}), model_folders=kind.folders(cfg), reward_functions=functions,
                          rows=dict(rows or {}))
