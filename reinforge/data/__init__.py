"""Datasets and collation: RL prompts, SFT pairs, preference pairs; loading and preprocessing.

Every dataset validates all rows at construction and raises DataError naming the file, the
row (counted from 0) and the field, e.g. "train.parquet: row 12: field 'prompt': empty prompt".
"""

from reinforge.data.io import DataError, load_rows, write_rows
from reinforge.data.loader import PromptLoader
from reinforge.data.preference import PreferenceDataset, collate_preference
from reinforge.data.preprocess import last_boxed, preprocess_gsm8k, preprocess_math
from reinforge.data.rl_dataset import RLDataset
from reinforge.data.sft import SFTDataset, collate_sft

__all__ = [
    "DataError", "load_rows", "write_rows", "RLDataset", "PromptLoader", "SFTDataset", "collate_sft",
    "PreferenceDataset", "collate_preference", "preprocess_gsm8k", "preprocess_math", "last_boxed",
]
