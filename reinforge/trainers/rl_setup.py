"""Build everything an RL run needs from its plan (trainers/plan.py): tokenizer, models, data, workers.

Kept apart from the step so that the trainer file stays the loop and nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from reinforge.algos.kl import make_kl_controller
from reinforge.config.load import ConfigError
from reinforge.config.schema import RLConfig
from reinforge.models.loading import load_causal_lm, load_critic, load_tokenizer, load_vlm_processor
from reinforge.models.lora import with_lora
from reinforge.models.vlm_processor import is_vlm_folder
from reinforge.trainers.logging import note_skipped
from reinforge.trainers.plan import RunPlan
from reinforge.trainers.run_dir import check_writable
from reinforge.workers.actor import ActorWorker
from reinforge.workers.critic import CriticWorker
from reinforge.workers.reference import ReferenceWorker
from reinforge.workers.reward import RewardWorker


@dataclass
class Components:
    tokenizer: Any
    actor_model: Any
    critic_model: Any
    rollout: Any
    reward: RewardWorker
    actor: ActorWorker
    reference: ReferenceWorker | None
    critic: CriticWorker | None
    kl_ctrl: Any
    loader: Any
    val_items: list
    teacher: ReferenceWorker | None = None  # on-policy distillation (teacher.coef > 0)
    skipped_prompts: int = 0  # training prompts data.overlong_prompt=skip dropped
    behaviour_policy: Any = None  # Ray with rollout.staleness > 0: the rollout-worker actors
    processor: Any = None  # a vision-language actor's processor: what its export saves beside the weights


class ConcatDataset:
    """Several prompt files read as one dataset (items keep their own data_source)."""

    def __init__(self, parts: list):
        self.parts = parts
        self.index = [(i, j) for i, p in enumerate(parts) for j in range(len(p))]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, k: int) -> dict:
        i, j = self.index[k]
        return self.parts[i][j]


def load_prompts(files: list[str], tokenizer, cfg: RLConfig, rows: dict | None = None, key: str = "data.train_files"):
    """The prompts of `files` (paths, or "python:..." names of `rows` handed over in Python)."""
    from reinforge.trainers.inputs import PromptDataset, data_source

    tools = None
    if cfg.rollout.max_turns > 1 and cfg.rollout.tool_parser == "hermes":  # the chat template lists the tools
        from reinforge.agents.loop import prompt_tools

        tools = prompt_tools(cfg.rollout)
    parts = [PromptDataset(data_source(f, key, rows or {}), tokenizer, name=f,
                           max_prompt_length=cfg.data.max_prompt_length, overlong_prompt=cfg.data.overlong_prompt,
                           prompt_key=cfg.data.prompt_key, tools=tools, max_pixels=cfg.data.max_pixels) for f in files]
    return parts[0] if len(parts) == 1 else ConcatDataset(parts)


def make_rollout(cfg: RLConfig, actor_model, tokenizer, **engine_kw):
    """The run's rollout (workers/rollout/__init__.py registry), in the agent loop when
    rollout.max_turns > 1. `engine_kw`: a Ray rank's extras for an own_weights engine."""
    from reinforge.workers.rollout import build_rollout, rollout_capabilities

    r, m = cfg.rollout, cfg.model
    if rollout_capabilities(r.backend).own_weights:  # it loads its own copy of the model (vLLM)
        engine_kw = dict(model_path=m.path, tokenizer_path=m.tokenizer_path or m.path, seed=cfg.trainer.seed,
                         trust_remote_code=m.trust_remote_code, **engine_kw)
    rollout = build_rollout(r.backend, actor_model, tokenizer, r, max_prompt_length=cfg.data.max_prompt_length,
                            **engine_kw)
    if r.agent:  # the user's agent against the model gateway (reinforge.gateway)
        from reinforge.gateway.rollout import make_gateway_rollout

        return make_gateway_rollout(r, rollout, tokenizer)
    if r.max_turns > 1:  # episodes of several turns with tools or an environment (reinforge.agents.loop)
        from reinforge.agents.loop import make_agent_rollout

        return make_agent_rollout(r, rollout, tokenizer)
    return rollout


@dataclass
class Workers:
    actor_model: Any
    actor: ActorWorker
    reference: ReferenceWorker | None
    critic_model: Any
    critic: CriticWorker | None


def _model_kwargs(plan: RunPlan) -> dict:
    m = plan.cfg.model
    return dict(dtype=m.dtype, device=plan.device, trust_remote_code=m.trust_remote_code,
                attn_implementation=m.attn_implementation)


def load_processing(m) -> tuple[Any, Any]:
    """(text tokenizer, what the datasets encode prompts with): for a vision-language actor
    folder the processor (images -> pixels and image tokens) and its tokenizer, else the
    tokenizer twice. Rewards, the rollout, stop tokens and exports take the text tokenizer."""
    if is_vlm_folder(m.path):
        proc = load_vlm_processor(m.tokenizer_path or m.path)
        return proc.tokenizer, proc
    tok = load_tokenizer(m.tokenizer_path or m.path, trust_remote_code=m.trust_remote_code)
    return tok, tok


def load_actor_model(plan: RunPlan, *, train: bool = True):
    """The actor's causal LM, wrapped with a LoRA adapter when model.lora_rank > 0. train=False:
    a frozen copy for generation (eval mode, no gradients, no gradient checkpointing: use_cache stays on)."""
    m = plan.cfg.model
    model = load_causal_lm(m.path, gradient_checkpointing=m.gradient_checkpointing, train=train,
                           freeze_vision_tower=m.freeze_vision_tower, **_model_kwargs(plan))
    model = with_lora(model, m)
    return model if train else model.requires_grad_(False)


def build_workers(plan: RunPlan, shard=None) -> Workers:
    """Models and the workers that train or score with them. `shard` (FSDP2's, in a Ray rank)
    is applied to each model before its optimizer is made; None in a local run."""
    cfg = plan.cfg
    m, t = cfg.model, cfg.trainer
    shard = shard or (lambda model: model)
    actor_model = shard(load_actor_model(plan))
    actor = ActorWorker(actor_model, cfg.actor, m, total_steps=t.total_steps,
                        mini_batch_size=plan.actor_mini_batch_size, micro_batch_size=plan.actor_micro_batch_size,
                        loss_norm_const=plan.loss_norm_const, seed=t.seed,
                        on_policy=plan.on_policy, tis_cap=plan.tis_cap)
    reference = None
    if plan.reference_enabled:
        # With LoRA the reference is the actor with its adapter disabled: no second copy.
        ref_model = actor_model if m.lora_rank > 0 else \
            shard(load_causal_lm(m.path, train=False, **_model_kwargs(plan)))
        reference = ReferenceWorker(ref_model, m, plan.actor_micro_batch_size, cfg.actor.max_tokens_per_micro_batch)
    critic_model = critic = None
    if plan.critic_enabled:
        critic_model = shard(load_critic(cfg.critic.model_path or m.path, gradient_checkpointing=m.gradient_checkpointing,
                                         reinit_head=cfg.critic.reinit_head, freeze_vision_tower=m.freeze_vision_tower,
                                         **_model_kwargs(plan)))
        critic = CriticWorker(critic_model, cfg.critic, total_steps=t.total_steps,
                              mini_batch_size=plan.critic_mini_batch_size,
                              micro_batch_size=plan.critic_micro_batch_size, seed=t.seed, use_packing=m.use_packing)
    return Workers(actor_model, actor, reference, critic_model, critic)


def make_teacher(plan: RunPlan, actor) -> ReferenceWorker:
    """The distillation teacher: a frozen model scoring the student's tokens exactly as the
    reference does (a second ReferenceWorker, another model folder), in this process. With
    teacher.mode=gkd the actor's loss also reads its whole distributions (workers/gkd.py)."""
    from reinforge.workers.gkd import GKDTerm

    cfg = plan.cfg
    model = load_causal_lm(cfg.teacher.path, train=False, **_model_kwargs(plan))
    if cfg.teacher.mode == "gkd":
        actor.gkd = GKDTerm(model, cfg.teacher.beta, cfg.teacher.coef)
    return ReferenceWorker(model, cfg.model, plan.actor_micro_batch_size, cfg.actor.max_tokens_per_micro_batch)


def build_rank_engine(plan: RunPlan, actor_model, rank: int, world: int):
    """A Ray rank's generation engine (reinforge.distributed.engine): an own_weights backend (vLLM)
    on the rank's GPU, fed from `actor_model`'s FSDP2 shards, or the lean/hf rollout on an
    unsharded frozen copy."""
    from reinforge.distributed.engine import RankEngine, rank_engine_kw
    from reinforge.workers.rollout import rollout_capabilities

    cfg = plan.cfg
    m = cfg.model
    tok = load_tokenizer(m.tokenizer_path or m.path, trust_remote_code=m.trust_remote_code)
    if rollout_capabilities(cfg.rollout.backend).own_weights:  # its own weights, streamed from the shards
        return RankEngine(make_rollout(cfg, actor_model, tok, **rank_engine_kw(rank, world)))
    dense = load_actor_model(plan, train=False)
    return RankEngine(make_rollout(cfg, dense, tok), dense)


def build_worker_rollout(plan: RunPlan):
    """A Ray rollout worker's engine (distributed/rollout_workers.py): the lean/hf rollout on its
    own unsharded frozen copy of the actor, which the worker's publications overwrite."""
    cfg, m = plan.cfg, plan.cfg.model
    tok = load_tokenizer(m.tokenizer_path or m.path, trust_remote_code=m.trust_remote_code)
    return make_rollout(cfg, load_actor_model(plan, train=False), tok)


def model_skeleton(plan: RunPlan, critic: bool = False):
    """The actor's (or critic's) modules and parameter shapes on the meta device, without
    weights: what the driver of a Ray run keeps, to count FLOPs."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification

    from reinforge.models.loading import resolve_dtype

    cfg = plan.cfg
    m = cfg.model
    path = cfg.critic.model_path or m.path if critic else m.path  # folders: the plan resolved Hub ids
    config = AutoConfig.from_pretrained(path, trust_remote_code=m.trust_remote_code, local_files_only=True)
    dtype = resolve_dtype(m.dtype, plan.device)
    with torch.device("meta"):
        if is_vlm_folder(path):  # the classes models/loading.py loads a VLM folder with
            from transformers import AutoModel, AutoModelForImageTextToText

            from reinforge.models.vlm_critic import VisionValueModel

            if critic:
                return VisionValueModel(AutoModel.from_config(config, dtype=dtype, trust_remote_code=m.trust_remote_code))
            return with_lora(AutoModelForImageTextToText.from_config(config, dtype=dtype,
                                                                     trust_remote_code=m.trust_remote_code), m)
        if critic:
            config.num_labels = 1
            return AutoModelForTokenClassification.from_config(config, dtype=dtype, trust_remote_code=m.trust_remote_code)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=m.trust_remote_code)
        model = with_lora(model, m)
    return model


def build_ray_workers(plan: RunPlan) -> tuple[Workers, Any]:
    """trainer.backend=ray: the workers and the generation engines live in a group of Ray actors
    (reinforge.distributed); the driver keeps weightless skeletons of the trained models."""
    from reinforge.distributed.group import RayWorkerGroup
    from reinforge.distributed.proxies import ActorProxy, CriticProxy, ReferenceProxy

    # the ranks build workers and engines, never read data: the rows handed over in Python stay here
    group = RayWorkerGroup(replace(plan, rows={}), build_workers, build_rank_engine)
    critic = plan.critic_enabled
    w = Workers(model_skeleton(plan), ActorProxy(group), ReferenceProxy(group) if plan.reference_enabled else None,
                model_skeleton(plan, critic=True) if critic else None, CriticProxy(group) if critic else None)
    return w, group


def load_data(plan: RunPlan, tok) -> tuple[Any, list, int]:
    """`tok`: a tokenizer, or a VLM's processor (load_processing). The training prompts, the validation items (the first data.max_val_samples) and how many
    training prompts data.overlong_prompt=skip dropped, read and tokenized with the length rules
    (with the datasets handed over in Python: plan.rows). `reinforge train --dry-run` stops after this."""
    cfg, rows = plan.cfg, plan.rows
    train = load_prompts(list(cfg.data.train_files), tok, cfg, rows)
    if len(train) < cfg.data.train_batch_size:
        raise ConfigError(f"data.train_files hold {len(train)} usable prompts, fewer than "
                         f"data.train_batch_size={cfg.data.train_batch_size}")
    parts = train.parts if isinstance(train, ConcatDataset) else [train]
    skipped = note_skipped(sum(p.num_skipped for p in parts), "training prompts",
                           f"data.max_prompt_length={cfg.data.max_prompt_length}", "data.overlong_prompt=skip")
    val_items = []
    if cfg.data.val_files:
        val = load_prompts(list(cfg.data.val_files), tok, cfg, rows, "data.val_files")
        val_items = [val[i] for i in range(min(len(val), cfg.data.max_val_samples))]
    return train, val_items, skipped


def build_components(plan: RunPlan) -> Components:
    """Everything the RL trainer holds, built from its plan (resolved and checked: trainers/plan.py)."""
    from reinforge.data import PromptLoader

    cfg = plan.cfg
    check_writable(cfg.trainer.run_dir)  # before any model loads
    device, m = plan.device, cfg.model
    behaviour = None
    tok, encoder = load_processing(m)
    train, val_items, skipped = load_data(plan, encoder)
    if cfg.trainer.backend == "ray":
        w, group = build_ray_workers(plan)
        from reinforge.distributed.proxies import RankRollout

        rollout = RankRollout(group, w.actor)  # generation on the ranks: the driver holds no weights
        if cfg.rollout.staleness > 0:  # disaggregated: rollout-worker actors apart from the ranks
            from reinforge.distributed.rollout_workers import RayBehaviour
            from reinforge.trainers.checkpoint import crash_point

            behaviour = RayBehaviour(group, replace(plan, rows={}), build_worker_rollout,
                                     workers=cfg.trainer.rollout_workers, timeout_s=cfg.trainer.weight_sync_timeout_s,
                                     staleness=cfg.rollout.staleness,
                                     on_published=lambda: crash_point("ray:publish"))
    else:
        w = build_workers(plan)
        rollout = make_rollout(cfg, w.actor_model, tok)
    a = cfg.algorithm
    kl_ctrl = make_kl_controller(a.kl_ctrl, a.kl_coef, target_kl=a.target_kl, horizon=a.kl_horizon) \
        if a.use_kl_in_reward else None
    reward = RewardWorker(tok, cfg.reward, a, max_response_length=cfg.rollout.max_response_length, device=device)
    teacher = make_teacher(plan, w.actor) if plan.teacher_enabled else None
    return Components(tok, w.actor_model, w.critic_model, rollout, reward, w.actor, w.reference,
                      w.critic, kl_ctrl, PromptLoader(train, cfg.data.train_batch_size, seed=cfg.data.seed), val_items,
                      teacher, skipped, behaviour, encoder if encoder is not tok else None)
