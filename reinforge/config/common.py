"""Sections shared by several trainers: the AdamW settings (actor, critic, SFT, DPO, RM), the
supervised trainers' optimizer section, the run section of every trainer (directory,
checkpoints, logging) and the generation eval section (SFT, DPO). Each trainer subclasses them
only to add fields or change defaults."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional


class RootConfig:
    """Mixin of the top-level configs (RL, SFT, DPO, RM): the plain dict written to run dirs."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_preset(cls, preset: str | None = None, /, **overrides):
        """A preset name or YAML path, then `overrides` as dotted keys (**{"actor.lr": 1e-6}) or
        nested dicts (trainer={"total_steps": 2}); checked like command-line overrides."""
        from reinforge.config.from_python import config_from

        return config_from(cls, preset, overrides)

    @classmethod
    def from_dict(cls, values: dict):
        """The defaults, then `values` shaped like a YAML config (nested sections or dotted
        keys; `base:` names a preset or YAML file to start from)."""
        from reinforge.config.from_python import config_from

        values = dict(values)
        return config_from(cls, values.pop("base", None), values)


@dataclass
class AdamWConfig:
    lr: float = 1e-5
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    warmup_steps: int = 0
    """Linear LR warmup, in optimizer (RL: training) steps."""
    lr_schedule: str = "constant"
    """LR schedule after warmup: constant, cosine or linear (to zero at the last step)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value (0 disables)."""
    max_nonfinite_steps: int = 3
    """Abort after this many consecutive optimizer steps skipped for a non-finite loss or gradient."""


@dataclass
class OptimConfig(AdamWConfig):
    micro_batch_size: int = 16
    """Rows (SFT) or pairs (DPO, RM) per forward/backward; gradients accumulate to the batch exactly."""
    max_nonfinite_steps: int = 5
    """Abort after this many consecutive optimizer steps skipped for a non-finite loss or gradient."""


@dataclass
class RunConfig:
    run_dir: str = "runs/run"
    """Run directory: config, metrics, checkpoints, hf export."""
    seed: int = 1
    """Global seed (torch, numpy, random)."""
    device: str = "auto"
    """cpu, cuda or auto."""
    save_every: int = 0
    """Checkpoint every k steps (0: only at the end)."""
    keep_last: int = 2
    """Checkpoints kept on disk."""
    val_every: int = 0
    """Evaluate on the held-out data every k steps (0: only at the end)."""
    val_before_train: bool = True
    """Evaluate once before the first step."""
    val_sampled: str = "end"
    """When validation also samples (mean@n, pass@k) besides greedy decoding: end (only at the
    last step), always, or never. Sampling costs n generations per prompt, greedy one."""
    loggers: list = field(default_factory=lambda: ["console", "jsonl", "tensorboard"])
    """console, jsonl, tensorboard, wandb, mlflow."""
    project_name: Optional[str] = None
    """wandb project / MLflow experiment; None: $WANDB_PROJECT for wandb (else "reinforge"),
    MLflow's own default ($MLFLOW_EXPERIMENT_NAME)."""
    experiment_name: Optional[str] = None
    """The run's name in wandb and MLflow (and TensorBoard's text tab); None: run_dir's folder name."""
    progress: bool = True
    """Show a progress bar."""
    export_hf: bool = True
    """Write the final model as a from_pretrained-loadable folder in run_dir/hf."""
    report: bool = True
    """Render the run report (plots + HTML in run_dir/report) at the end."""


@dataclass
class SupervisedRunConfig(RunConfig):
    """The run section of SFT, DPO and RM: the step budget sits here, as trainer.total_steps
    does in RL, and may derive from the data size."""
    total_steps: int = 0
    """Optimizer steps; 0 means derive from trainer.epochs and the number of training rows."""
    epochs: float = 1.0
    """Passes over the training data when trainer.total_steps is 0."""


@dataclass
class GenEvalConfig:
    prompt_files: list = field(default_factory=list)
    """RL-schema prompt files with ground truth (a task's test.parquet) for greedy / sampled
    accuracy of the policy during training; empty skips it."""
    reward_functions: list = field(default_factory=lambda: [{"name": "exact_match", "weight": 1.0}])
    """Reward functions that score the generated answers, as reward.functions of the RL config."""
    max_prompt_length: int = 512
    """Prompts are left-padded to this length for generation."""
    max_response_length: int = 512
    """Tokens generated per answer."""
    max_samples: int = 200
    """Prompts evaluated (the first N of the files)."""
    n: int = 1
    """Samples per prompt for the sampled accuracy (greedy always runs)."""
    temperature: float = 1.0
    """Temperature of the sampled evaluation."""
    batch_size: int = 64
    """Prompts per generation call."""
