"""A tiny Qwen2-architecture model built from config, for tests and the CPU demo.

~3M parameters at the defaults (hidden 256, 4 layers, 4 heads / 2 KV heads, MLP 704, tied
embeddings): the size measured in shared/FINDINGS.md. Nothing is downloaded.
`make_tiny_moe_model`: the same for a mixture-of-experts family (Qwen3-MoE, Qwen2-MoE, Mixtral).
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2_config(vocab_size: int, *, hidden_size: int = 256, num_layers: int = 4, num_heads: int = 4,
                      num_kv_heads: int = 2, intermediate_size: int = 704, max_positions: int = 256,
                      pad_token_id: int | None = None, eos_token_id: int | None = None,
                      bos_token_id: int | None = None) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True, rope_theta=10000.0,
        pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=bos_token_id,
        architectures=["Qwen2ForCausalLM"],
    )


def make_tiny_model(tokenizer, out_dir: str | None = None, *, seed: int = 0, **config_kwargs) -> Qwen2ForCausalLM:
    """A randomly initialised tiny causal LM for `tokenizer`; saved with it when `out_dir` is given."""
    config = tiny_qwen2_config(len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                               eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                               **config_kwargs)
    return _init_and_save(lambda: Qwen2ForCausalLM(config), tokenizer, out_dir, seed)


def _init_and_save(build, tokenizer, out_dir: str | None, seed: int):
    """build() under torch seed `seed` (the caller's RNG untouched), its generation config given the
    tokenizer's pad / eos ids, saved with the tokenizer when `out_dir` is given."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = build()
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    return model


_MOE_FAMILIES = {  # family -> (config class, model class, the family's own keys)
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(norm_topk_prob=True, head_dim=None)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(norm_topk_prob=False, qkv_bias=True)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(sliding_window=None)),
}


def tiny_moe_config(vocab_size: int, family: str = "qwen3_moe", *, hidden_size: int = 128, num_layers: int = 2,
                    num_heads: int = 4, num_kv_heads: int = 2, expert_size: int = 64, num_experts: int = 8,
                    top_k: int = 2, max_positions: int = 256, **token_ids):
    """A tiny MoE config of `family` (a key of _MOE_FAMILIES): every layer sparse, `num_experts`
    experts of width `expert_size`, `top_k` a token; Qwen2-MoE adds its gated shared expert
    (4 x expert_size wide). token_ids: pad / eos / bos_token_id."""
    import transformers

    if family not in _MOE_FAMILIES:
        raise ValueError(f"unknown MoE family {family!r}; known: {', '.join(_MOE_FAMILIES)}")
    config_cls, model_cls, own = _MOE_FAMILIES[family]
    kw = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=4 * expert_size,
              num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
              max_position_embeddings=max_positions, tie_word_embeddings=True, rope_theta=10000.0,
              num_experts_per_tok=top_k, architectures=[model_cls], **token_ids)
    if family == "mixtral":
        kw.update(num_local_experts=num_experts, intermediate_size=expert_size)
    else:
        kw.update(num_experts=num_experts, moe_intermediate_size=expert_size, decoder_sparse_step=1, mlp_only_layers=[])
    if family == "qwen2_moe":
        kw["shared_expert_intermediate_size"] = 4 * expert_size
    kw.update({k: v for k, v in own.items() if v is not None})
    return getattr(transformers, config_cls)(**kw)


def make_tiny_moe_model(tokenizer, out_dir: str | None = None, *, family: str = "qwen3_moe", seed: int = 0,
                        **config_kwargs):
    """A randomly initialised tiny MoE causal LM (`tiny_moe_config`) for `tokenizer`; saved with it
    when `out_dir` is given."""
    from transformers import AutoModelForCausalLM

    config = tiny_moe_config(len(tokenizer), family, pad_token_id=tokenizer.pad_token_id,
                             eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id, **config_kwargs)
    return _init_and_save(lambda: AutoModelForCausalLM.from_config(config, dtype=torch.float32), tokenizer, out_dir,
                          seed)
