"""reinforge: RL post-training for language models, readable and exact.

    from reinforge import RLConfig, RLTrainer

    cfg = RLConfig.from_preset("grpo", **{"model.path": "models/tiny", "trainer.total_steps": 2})
    RLTrainer(cfg, reward_funcs=[my_reward], train_dataset=rows).fit()

SFTConfig/SFTTrainer, DPOConfig/DPOTrainer and RMConfig/RMTrainer likewise. The names are
imported on first use, so `import reinforge` (the CLI's first step) loads neither torch nor
transformers.
"""

__version__ = "0.1.0"

# name -> module that defines it
_LAZY = {
    "RLConfig": "reinforge.config.schema",
    "RLTrainer": "reinforge.trainers.rl",
    "SFTConfig": "reinforge.config.sft",
    "SFTTrainer": "reinforge.trainers.sft",
    "DPOConfig": "reinforge.config.preference",
    "DPOTrainer": "reinforge.trainers.dpo",
    "RMConfig": "reinforge.config.preference",
    "RMTrainer": "reinforge.trainers.rm",
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'reinforge' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
