"""Typed configuration of supervised fine-tuning (`reinforge sft`).

The model section is the RL one (reinforge.config.schema.ModelConfig), so an SFT run and the RL
run that starts from its export read the same keys. `validate_sft` checks the values before any
model loads (trainers/plan.py derives the run's plan from them).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from reinforge.config.common import GenEvalConfig, OptimConfig, RootConfig, SupervisedRunConfig
from reinforge.config.schema import ModelConfig
from reinforge.config.ranges import check_ranges
from reinforge.config.validate import check_model_path, normalize_reward_functions, validate_supervised


@dataclass
class SFTDataConfig:
    train_files: list = field(default_factory=list)
    """Parquet/JSONL files of prompt/response (or messages) rows."""
    val_files: list = field(default_factory=list)
    """Held-out rows of the same schema for the validation loss."""
    max_length: int = 128
    """Longest prompt + response + EOS in tokens."""
    overlong: str = "error"
    """What to do with a longer row: error, skip or truncate_right."""
    batch_size: int = 64
    """Examples per optimizer step (with packing: rows of packed examples per step)."""
    packing: bool = False
    """Concatenate examples into rows of max_length tokens; attention never crosses examples (image
    rows too: each keeps its own M-RoPE positions)."""
    seed: int = 1
    """Shuffling seed for the example order."""
    max_pixels: int = 12845056
    """Largest image (width * height pixels) an image row may hold; a larger one is refused
    when the data loads, naming file, row and field. The default is the Qwen2-VL image
    processor's own budget (16384 patches of 28x28 pixels)."""


@dataclass
class SFTOptimConfig(OptimConfig):
    lr: float = 1e-3
    """AdamW learning rate."""
    lr_schedule: str = "cosine"
    """LR schedule after warmup: constant, cosine or linear (to zero at the last step)."""
    micro_batch_size: int = 64
    """Rows per forward/backward; gradients accumulate to the batch exactly."""


@dataclass
class SFTEvalConfig(GenEvalConfig):
    n: int = 8
    """Samples per prompt for the sampled accuracy and pass@k (greedy always runs too)."""
    pass_k: list = field(default_factory=lambda: [1, 8])
    """k values of pass@k."""


@dataclass
class SFTTrainerConfig(SupervisedRunConfig):
    run_dir: str = "runs/sft"
    """Run directory: config, metrics, checkpoints, hf export."""
    val_before_train: bool = False
    """Evaluate once before the first step."""


@dataclass
class SFTConfig(RootConfig):
    model: ModelConfig = field(default_factory=ModelConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    eval: SFTEvalConfig = field(default_factory=SFTEvalConfig)
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)

    model_path_keys: ClassVar[tuple[str, ...]] = ("model.path", "model.tokenizer_path")
    """The keys that name model folders (a Hub id among them is resolved: models/hub.py)."""


def validate_sft(cfg: SFTConfig) -> SFTConfig:
    """Check the rules about `cfg`'s values; returns it unchanged."""
    check_ranges(cfg)
    check_model_path(cfg.model.path, "model.path")
    normalize_reward_functions(cfg.eval.reward_functions, "eval.reward_functions")
    validate_supervised(cfg, cfg.eval)
    return cfg
