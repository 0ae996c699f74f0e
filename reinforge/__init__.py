"""reinforge: RL post-training for language models, readable and exact."""

__version__ = "0.1.0"
