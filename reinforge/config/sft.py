"""Typed configuration of supervised fine-tuning (`reinforge sft`).

The model section is the RL one (reinforge.config.schema.ModelConfig), so an SFT run and the RL
run that starts from its export read the same keys. `validate_sft` checks and derives in one
place before any model loads.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from reinforge.config.common import GenEvalConfig, OptimConfig, RootConfig, SupervisedRunConfig
from reinforge.config.schema import ModelConfig
from reinforge.config.ranges import check_ranges
from reinforge.config.validate import (check_choice, check_data_files, check_model_path, normalize_reward_functions,
                                       validate_supervised)
from reinforge.data.sft import SFT_OVERLONG


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
    """Concatenate examples into rows of max_length tokens; attention never crosses examples."""
    seed: int = 1
    """Shuffling seed for the example order."""


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
    derived: dict = field(default_factory=dict)
    """Filled by validate_sft(): values computed from the others (not for users to set)."""


def validate_sft(cfg: SFTConfig, num_train_examples: Optional[int] = None) -> SFTConfig:
    """Check `cfg` and fill `cfg.derived` (device; total_steps once the data size is known)."""
    d = cfg.data
    check_ranges(cfg)
    check_model_path(cfg.model.path, "model.path")
    check_data_files(d.train_files, {"data.val_files": d.val_files, "eval.prompt_files": cfg.eval.prompt_files})
    cfg.eval.reward_functions = normalize_reward_functions(cfg.eval.reward_functions, "eval.reward_functions")
    check_choice(d.overlong, SFT_OVERLONG, "data.overlong")
    validate_supervised(cfg, num_train_examples)
    return cfg
