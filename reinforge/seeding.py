"""One seed for Python's, NumPy's and torch's generators: every process of a run (trainers,
data-parallel ranks) seeds through here, so they start from the same state."""
from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
