"""LoRA (PEFT) on the actor: only adapter weights train, the reference is the base model with the
adapter disabled (the same module, no copy), and the HF export holds the merged weights."""
from __future__ import annotations

import torch

from reinforge.config.load import load_config
from reinforge.config.schema import RLConfig
from reinforge.models.forward import response_logprobs
from reinforge.trainers.rl import RLTrainer
from tests.conftest import rl_overrides


def _batch_logprobs(model, batch):
    with torch.no_grad():
        return response_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["responses"].shape[1])[0]


def test_grpo_with_lora(tiny_model_dir, arith_data, tmp_path):
    from transformers import AutoModelForCausalLM

    extra = {"model.lora_rank": 4, "model.lora_alpha": 8, "model.lora_target_modules": "[q_proj, v_proj, up_proj]",
             "actor.lr": 1e-2, "trainer.val_before_train": False}
    trainer = RLTrainer(load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path), **extra)))
    model = trainer.actor_model
    assert trainer.reference.model is model  # no second copy of the weights
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    trainer.fit()

    after = dict(model.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed and changed <= trainable  # only adapter weights moved
    assert any("lora_B" in n for n in changed)

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    batch = trainer.rollout.generate(_prompts(trainer), n=2, temperature=1.0)
    ref = trainer.reference.log_probs(batch)["ref_log_probs"]
    m = batch["response_mask"].bool()
    assert (ref - _batch_logprobs(base, batch))[m].abs().max() <= 1e-5  # reference == base model
    actor_lp = _batch_logprobs(model, batch)
    assert (actor_lp - ref)[m].abs().max() > 1e-4  # the adapter changed the policy
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert (_batch_logprobs(merged, batch) - actor_lp)[m].abs().max() <= 1e-4  # export = adapter merged


def _prompts(trainer):
    from reinforge.trainers.validation import prompts_batch

    return prompts_batch(trainer.val_items[:2], 0)
