"""Build everything an RL run needs from a validated config: tokenizer, models, data, workers.

Kept apart from the step so that the trainer file stays the loop and nothing else.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from reinforge.algos.kl import make_kl_controller
from reinforge.config.schema import RLConfig
from reinforge.config.validate import validate
from reinforge.models.loading import load_causal_lm, load_critic, load_tokenizer
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


def load_prompts(files: list[str], tokenizer, cfg: RLConfig):
    from reinforge.data import RLDataset

    parts = [RLDataset(f, tokenizer, max_prompt_length=cfg.data.max_prompt_length,
                       overlong_prompt=cfg.data.overlong_prompt, prompt_key=cfg.data.prompt_key) for f in files]
    return parts[0] if len(parts) == 1 else ConcatDataset(parts)


def make_rollout(cfg: RLConfig, actor_model, tokenizer):
    r = cfg.rollout
    if r.backend == "vllm":
        from reinforge.workers.rollout.vllm import VLLMRollout

        return VLLMRollout(cfg, actor_model, tokenizer)
    from reinforge.workers.rollout.hf import HFRollout

    return HFRollout(actor_model, tokenizer, max_prompt_length=cfg.data.max_prompt_length,
                     max_response_length=r.max_response_length, micro_batch_size=r.micro_batch_size,
                     top_p=r.top_p, top_k=r.top_k)


def build_components(cfg: RLConfig) -> Components:
    from reinforge.data import PromptLoader

    validate(cfg)
    d, m = cfg.derived, cfg.model
    device = d["device"]
    tok = load_tokenizer(m.tokenizer_path or m.path, trust_remote_code=m.trust_remote_code)
    train = load_prompts(list(cfg.data.train_files), tok, cfg)
    if len(train) < cfg.data.train_batch_size:
        raise ValueError(f"data.train_files hold {len(train)} usable prompts, fewer than "
                         f"data.train_batch_size={cfg.data.train_batch_size}")
    val_items = []
    if cfg.data.val_files:
        val = load_prompts(list(cfg.data.val_files), tok, cfg)
        val_items = [val[i] for i in range(min(len(val), cfg.data.max_val_samples))]
    kw = dict(dtype=m.dtype, device=device, trust_remote_code=m.trust_remote_code,
              attn_implementation=m.attn_implementation)
    actor_model = load_causal_lm(m.path, gradient_checkpointing=m.gradient_checkpointing, **kw)
    t = cfg.trainer
    actor = ActorWorker(actor_model, cfg.actor, m, total_steps=t.total_steps, mini_batch_size=d["actor_mini_batch_size"],
                        micro_batch_size=d["actor_micro_batch_size"], loss_norm_const=d["loss_norm_const"], seed=t.seed)
    reference = None
    if d["reference_enabled"]:
        ref_model = load_causal_lm(m.path, train=False, **kw)
        reference = ReferenceWorker(ref_model, m, d["actor_micro_batch_size"])
    critic_model = critic = None
    if d["critic_enabled"]:
        critic_model = load_critic(cfg.critic.model_path or m.path, gradient_checkpointing=m.gradient_checkpointing,
                                   reinit_head=cfg.critic.reinit_head, **kw)
        critic = CriticWorker(critic_model, cfg.critic, total_steps=t.total_steps,
                              mini_batch_size=d["critic_mini_batch_size"],
                              micro_batch_size=d["critic_micro_batch_size"], seed=t.seed)
    a = cfg.algorithm
    kl_ctrl = make_kl_controller(a.kl_ctrl, a.kl_coef, target_kl=a.target_kl, horizon=a.kl_horizon) \
        if a.use_kl_in_reward else None
    reward = RewardWorker(tok, cfg.reward, a, max_response_length=cfg.rollout.max_response_length, device=device)
    return Components(tok, actor_model, critic_model, make_rollout(cfg, actor_model, tok), reward, actor, reference,
                      critic, kl_ctrl, PromptLoader(train, cfg.data.train_batch_size, seed=cfg.data.seed), val_items)
