"""A tiny Qwen2-architecture model built from config, for tests and the CPU demo.

~3M parameters at the defaults (hidden 256, 4 layers, 4 heads / 2 KV heads, MLP 704, tied
embeddings): the size measured in shared/FINDINGS.md. Nothing is downloaded.
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
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
    return model
