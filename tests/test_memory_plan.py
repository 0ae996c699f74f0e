"""Activation checkpointing and the actor's micro-batch from the memory budget
(models/shape_defaults.resolve_memory, trainers/plan.py): checkpointed gradients equal the plain
ones through the fused log-prob head, the plan's choices by model size and budget, and a micro-
batch chosen by the budget leaves the accumulated gradient unchanged (tests/grad_check.py)."""
from __future__ import annotations

import functools
import json

import pytest
import torch

from reinforge.config.load import ConfigError, load_config
from reinforge.config.schema import RLConfig
from reinforge.models import shape_defaults as sd
from reinforge.models.forward import response_logprobs
from reinforge.models.loading import checkpointing_on, load_causal_lm
from reinforge.trainers.plan import plan_rl
from tests.conftest import ragged_batch, rl_overrides
from tests.grad_check import GRAD_RTOL, grad_gap

pytestmark = pytest.mark.usefixtures("one_thread")

QWEN05 = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
          "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True}


def _grads(model, batch, fused: bool, autocast: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    T = batch["responses"].shape[1]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logp, ent = response_logprobs(model, batch["input_ids"], batch["attention_mask"], T, with_entropy=True,
                                      fused=fused, chunk_size=5)
    mask = batch["response_mask"].float()
    ((logp * mask).sum() / mask.sum() - 0.1 * (ent * mask).sum() / mask.sum()).backward()
    return logp.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("fused", [True, False])
def test_checkpointed_gradients_equal_the_plain_ones(tiny_model_dir, fused):
    plain = load_causal_lm(tiny_model_dir)
    ckpt = load_causal_lm(tiny_model_dir, gradient_checkpointing="true")
    assert ckpt.model.layers[0].gradient_checkpointing and not plain.model.layers[0].gradient_checkpointing
    batch = ragged_batch(plain.config.vocab_size, B=3, P=4, T=5)
    lp_a, g_a = _grads(plain, batch, fused)
    lp_b, g_b = _grads(ckpt, batch, fused)
    assert torch.allclose(lp_a, lp_b, atol=1e-6)
    assert grad_gap(g_a, g_b) <= GRAD_RTOL
    # under bf16 autocast the recompute runs in the forward's autocast state: the same bf16 matmuls
    lp_a, g_a = _grads(plain, batch, fused, autocast=True)
    lp_b, g_b = _grads(ckpt, batch, fused, autocast=True)
    assert torch.allclose(lp_a, lp_b, atol=1e-6)
    assert grad_gap(g_a, g_b) <= GRAD_RTOL


def test_checkpointing_flag_values():
    assert checkpointing_on(True) and checkpointing_on("true") and checkpointing_on("True")
    assert not checkpointing_on("false") and not checkpointing_on(False)
    assert not checkpointing_on("auto")  # unresolved outside a plan: off, as before the key had auto
    with pytest.raises(ValueError, match="gradient_checkpointing='yes'"):
        checkpointing_on("yes")


def test_activation_estimate_of_the_qwen05_shape(tmp_path):
    shape = {"hidden": 896, "layers": 24, "vocab": 151936, "inter": 4864, "heads": 14, "head_dim": 64, "kv": 128}
    (tmp_path / "config.json").write_text(json.dumps(QWEN05))
    assert sd.model_shape(str(tmp_path)) == shape
    # per token and layer: 6 * 896 * 4 = 21,504 fp32 bytes + (6 * 896 + 4 * 128 + 4 * 4864) = 25,344 operands
    plain = sd.activation_bytes(shape, 16, 38, checkpointing=False, matmul_bytes=2, resid_bytes=4)
    assert plain == 16 * 38 * 24 * (21_504 + 2 * 25_344)
    ckpt = sd.activation_bytes(shape, 16, 38, checkpointing=True, matmul_bytes=2, resid_bytes=4)
    assert ckpt == 16 * 38 * (24 * 896 * 4 + 21_504 + 2 * 25_344)
    assert plain / ckpt > 10  # what checkpointing saves at 24 layers


def test_resolve_memory_by_size_and_budget(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN05))
    # a GPU: checkpointing only when the budget needs it (the budget is given, so no GPU is asked)
    big = dict(model_path=str(tmp_path), device="cuda", weights_bytes=4, bf16_autocast=True, mini=16, seq=256)
    state = 16 * sd.config_params(str(tmp_path))  # 7.9 GB
    roomy = sd.resolve_memory(ckpt="auto", micro=0, budget_gb=100.0, **big)
    assert (roomy.gradient_checkpointing, roomy.micro_batch_size, roomy.state_bytes) == (False, 16, state)
    # 10 GB: the whole mini-batch of 256-token rows (~7 GB of activations) does not fit, a few rows do
    tight = sd.resolve_memory(ckpt="auto", micro=0, budget_gb=10.0, **big)
    assert not tight.gradient_checkpointing and 1 <= tight.micro_batch_size < 16
    assert 16 % tight.micro_batch_size == 0 and tight.state_bytes + tight.activation_bytes <= 10e9
    # 8.9 GB: not even one row without checkpointing: it switches on (and the micro-batch grows again)
    tighter = sd.resolve_memory(ckpt="auto", micro=0, budget_gb=8.9, **big)
    assert tighter.gradient_checkpointing and tighter.state_bytes + tighter.activation_bytes <= 8.9e9
    assert tighter.micro_batch_size > tight.micro_batch_size
    assert sd.resolve_memory(ckpt="false", micro=0, budget_gb=8.9, **big).gradient_checkpointing is False
    # a CPU: on, unless the prompts' forwards are shared (n = 8, 64-token prompts, 24-token
    # responses) and their activations fit: then off; too tight for those: on again
    cpu = {**big, "device": "cpu"}
    assert sd.resolve_memory(ckpt="auto", micro=0, budget_gb=100.0, **cpu).gradient_checkpointing
    shared = sd.resolve_memory(ckpt="auto", micro=0, budget_gb=100.0, shared=(8, 64, 24), **cpu)
    assert not shared.gradient_checkpointing and shared.micro_batch_size == 16
    want = sd.activation_bytes(sd.model_shape(str(tmp_path)), 1, 2 * 64 + 16 * 24, checkpointing=False,
                               matmul_bytes=2, resid_bytes=4)
    assert shared.activation_bytes - sd.head_bytes(sd.model_shape(str(tmp_path)), 16 * 256, True) == want
    assert sd.resolve_memory(ckpt="auto", micro=0, budget_gb=8.0, shared=(8, 64, 24), **cpu).gradient_checkpointing
    assert sd.resolve_memory(ckpt="true", micro=4, budget_gb=100.0, **big).micro_batch_size == 4
    assert "gradient checkpointing on" in tighter.line()
    # a CPU: auto checkpoints a large model whatever the budget (cheap there: docs/performance.md)
    cpu = dict(big, device="cpu")
    for budget in (100.0, 10.0):
        on_cpu = sd.resolve_memory(ckpt="auto", micro=0, budget_gb=budget, **cpu)
        assert on_cpu.gradient_checkpointing and on_cpu.micro_batch_size == 16
    assert sd.resolve_memory(ckpt="false", micro=0, budget_gb=100.0, **cpu).gradient_checkpointing is False
    assert sd.resolve_memory(ckpt="false", micro=0, budget_gb=10.0, **cpu).micro_batch_size < 16


def test_small_models_keep_the_former_defaults(tiny_model_dir):
    small = dict(model_path=tiny_model_dir, device="cpu", weights_bytes=4, bf16_autocast=False, seq=64, budget_gb=0.001)
    assert sd.resolve_memory(ckpt="auto", micro=0, mini=256, **small).micro_batch_size == 16
    assert sd.resolve_memory(ckpt="auto", micro=0, mini=24, **small).micro_batch_size == 12  # a divisor
    assert sd.resolve_memory(ckpt="auto", micro=0, mini=8, **small).micro_batch_size == 8
    assert sd.resolve_memory(ckpt="auto", micro=0, mini=256, **small).gradient_checkpointing is False


def test_plan_records_the_choices(tiny_model_dir, arith_data, tmp_path, monkeypatch):
    def plan(**extra):
        return plan_rl(load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path), **extra)))

    assert plan().actor_micro_batch_size == 8  # an explicit size is kept
    p = plan(**{"actor.micro_batch_size": 0})  # auto
    assert p.gradient_checkpointing is False and p.cfg.model.gradient_checkpointing == "false"
    assert p.actor_micro_batch_size == p.cfg.actor.micro_batch_size == min(16, p.actor_mini_batch_size)
    rec = p.record()
    assert rec["gradient_checkpointing"] is False and rec["logprob_path"].startswith("fused, ")
    assert plan(**{"model.gradient_checkpointing": "true"}).gradient_checkpointing is True
    assert plan(**{"model.gradient_checkpointing": "True"}).cfg.model.gradient_checkpointing == "true"
    assert plan(**{"model.fused_logprobs": "false"}).logprob_path == "logits"
    monkeypatch.setattr(sd, "LARGE_PARAMS", 1000)  # the tiny model counts as large: the budget decides
    big = plan(**{"model.memory_budget_gb": "1000", "actor.micro_batch_size": 0})
    assert big.actor_micro_batch_size == big.actor_mini_batch_size
    # a CPU: off while each prompt's forward is shared (that path needs the cache), else on
    assert not big.gradient_checkpointing and big.cfg.model.gradient_checkpointing == "false"
    whole = plan(**{"model.memory_budget_gb": "1000", "actor.micro_batch_size": 0, "model.share_prompt": "false"})
    assert whole.gradient_checkpointing and whole.cfg.model.gradient_checkpointing == "true"
    assert "budget 1000.00 GB" in big.record()["memory"]
    with pytest.raises(ConfigError, match="model.gradient_checkpointing='sometimes'"):
        plan(**{"model.gradient_checkpointing": "sometimes"})


def test_a_budget_chosen_micro_batch_and_checkpointing_keep_the_gradient(tiny_model_dir, arith_data, tmp_path,
                                                                         monkeypatch):
    """The tiny model counted as large: a roomy budget gives the whole mini-batch of 16 in one
    micro-batch (checkpointing off, which a CPU's auto would switch on); a budget that fits 2
    checkpointed rows gives micro-batches of 2 with checkpointing.
    Both updates accumulate the same gradient (2 epochs, the second run replaying the first's
    gradients so both stay at the same weights: tests/grad_check.py)."""
    from reinforge.trainers.rl import RLTrainer
    from tests.grad_check import assert_same_steps, record_steps

    monkeypatch.setattr(sd, "LARGE_PARAMS", 1000)
    n = sd.config_params(tiny_model_dir)
    shape = sd.model_shape(tiny_model_dir)
    two = 16 * n + sd.activation_bytes(shape, 2, 14, checkpointing=True, matmul_bytes=4, resid_bytes=4) \
        + sd.head_bytes(shape, 28, True)
    grads, plans = [], []
    for name, extra in (("roomy", {"model.memory_budget_gb": 1000, "model.gradient_checkpointing": "false"}),
                        ("tight", {"model.memory_budget_gb": (two + 1) / 1e9, "model.gradient_checkpointing": "true"})):
        cfg = load_config(RLConfig, "grpo", rl_overrides(
            tiny_model_dir, arith_data, str(tmp_path / name),
            **{"trainer.total_steps": 1, "actor.micro_batch_size": 0, "actor.mini_batch_size": 16, "actor.ppo_epochs": 2,
               "actor.grad_clip": 0, "actor.use_kl_loss": False, "trainer.val_before_train": False,
               "data.val_files": "[]", "trainer.export_hf": False, "model.autocast": "none", "rollout.dtype": "model",
               **extra}))  # fp32: bf16 matmuls round differently by micro-batch shape
        t = RLTrainer(cfg)
        plans.append((t.plan.actor_micro_batch_size, t.plan.gradient_checkpointing,
                      t.actor.model.model.layers[0].gradient_checkpointing))
        grads.append(record_steps(t.actor.opt, t.actor.params, replay=grads[0] if grads else None))
        t.fit()
    assert plans == [(16, False, False), (2, True, True)]
    assert_same_steps(grads[0], grads[1])



def test_lora_trains_under_checkpointing(tiny_model_dir, arith_data, tmp_path):
    """LoRA's frozen embeddings under non-reentrant checkpointing: the adapters still get gradients."""
    from reinforge.trainers.rl import RLTrainer

    extra = {"model.lora_rank": 4, "model.lora_target_modules": "[q_proj, v_proj]", "actor.lr": 1e-2,
             "model.gradient_checkpointing": "true", "trainer.total_steps": 1, "trainer.val_before_train": False,
             "data.val_files": "[]", "trainer.export_hf": False}
    t = RLTrainer(load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path), **extra)))
    before = {n: p.detach().clone() for n, p in t.actor_model.named_parameters() if "lora_B" in n}
    t.fit()
    after = dict(t.actor_model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_critic_micro_batch_from_the_budget(tiny_model_dir, arith_data, tmp_path, monkeypatch):
    """critic.micro_batch_size=0 (auto): below LARGE_PARAMS the former 16 (capped, a divisor);
    counted as large, the largest divisor of the critic's mini-batch that fits the budget left
    by the actor's state and the critic's own; an explicit size is kept."""
    def plan(**extra):
        over = rl_overrides(tiny_model_dir, arith_data, str(tmp_path), **{"rollout.n": 8, **extra})
        return plan_rl(load_config(RLConfig, "ppo", over))  # a batch of 4 x 8 = 32 rows

    assert plan().critic_micro_batch_size == 16 == plan().cfg.critic.micro_batch_size
    assert plan(**{"critic.mini_batch_size": 8}).critic_micro_batch_size == 8
    assert plan(**{"critic.micro_batch_size": 4}).critic_micro_batch_size == 4
    monkeypatch.setattr(sd, "LARGE_PARAMS", 1000)
    assert plan(**{"model.memory_budget_gb": 1000}).critic_micro_batch_size == 32  # the whole mini-batch
    # a budget that holds the actor's state (with PPO's reference copy: 16 + 4 bytes per parameter),
    # the critic's and 2 rows' activations (no LM head), not 4
    n, shape = sd.config_params(tiny_model_dir), sd.model_shape(tiny_model_dir)
    act = functools.partial(sd.activation_bytes, shape, seq=14, checkpointing=False, matmul_bytes=4, resid_bytes=4)
    budget = 20 * n + 16 * n + act(2) + 1
    actor = sd.resolve_memory(ckpt="false", micro=1, mini=32, seq=14, model_path=tiny_model_dir, device="cpu",
                              budget_gb=budget / 1e9, weights_bytes=4, bf16_autocast=False, reference=True)
    assert actor.state_bytes == 20 * n and actor.state_bytes + actor.activation_bytes <= budget
    assert 20 * n + 16 * n + act(4) > budget
    p = plan(**{"model.memory_budget_gb": budget / 1e9, "actor.micro_batch_size": 1,
                "model.gradient_checkpointing": "false", "model.autocast": "none"})
    assert p.critic_micro_batch_size == 2


def test_critic_gradient_does_not_depend_on_its_micro_batch(tiny_model_dir):
    """A budget-forced critic micro-batch of 2 accumulates the gradient of the whole mini-batch of 8."""
    from reinforge.config.schema import CriticConfig
    from reinforge.models.loading import load_critic
    from reinforge.workers.critic import CriticWorker
    from tests.grad_check import assert_same_steps, record_steps

    def critic(micro: int) -> CriticWorker:
        torch.manual_seed(0)
        model = load_critic(tiny_model_dir, dtype="float32")
        cfg = CriticConfig(lr=1e-4, micro_batch_size=micro, grad_clip=0)
        return CriticWorker(model, cfg, total_steps=1, mini_batch_size=8, micro_batch_size=micro, seed=0)

    whole, split = critic(8), critic(2)
    batch = ragged_batch(whole.model.config.vocab_size, B=8, P=4, T=5)
    batch = batch | whole.values(batch)
    batch = batch | type(batch)({"returns": batch["values"] + torch.linspace(-1, 1, 40).view(8, 5)})
    ga, gb = record_steps(whole.opt, whole.params), record_steps(split.opt, split.params)
    whole.update(batch), split.update(batch)
    assert_same_steps(ga, gb)


def test_full_attention_from_config(tmp_path):
    """Which models can share a prompt's cache: no sliding window, no linear attention, no vision."""
    cases = [({"model_type": "llama"}, True),
             ({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False,
               "layer_types": ["full_attention"] * 2}, True),
             ({"model_type": "mistral", "sliding_window": 4096}, False),
             ({"model_type": "gemma3_text", "layer_types": ["sliding_attention", "full_attention"]}, False),
             ({"model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"]}, False),
             ({"model_type": "qwen2_vl", "vision_config": {}}, False),
             ({"model_type": "qwen3_moe", "num_experts": 8}, False)]
    for i, (config, want) in enumerate(cases):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "config.json").write_text(json.dumps(config))
        assert sd.full_attention(str(tmp_path / str(i))) is want, config
    assert sd.full_attention(str(tmp_path / "missing")) is False
