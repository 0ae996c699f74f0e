"""What a Python user hands a trainer besides its config: reward functions and datasets in memory.

    RLTrainer(cfg, reward_funcs=[fn], train_dataset=ds, eval_dataset=None).fit()
    SFTTrainer(cfg, train_dataset=ds).fit()   # DPOTrainer, RMTrainer: the same datasets

- reward_funcs: callables in any reward style (reinforge.rewards.styles), spec strings
  ("math_verify", "file.py:fn"), or {"name": fn, "weight": w, "style": s}; they replace
  reward.functions. A callable is recorded in config.yaml as "python:<its name>".
- train_dataset / eval_dataset: a `datasets.Dataset`, a list of dicts, or a path (anything
  data.train_files takes). Rows in memory are recorded as "python:train_dataset" /
  "python:eval_dataset" in data.train_files / data.val_files and pass the same row checks
  as a file's rows (the trainer's dataset class reads them in place of a file).
"""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from reinforge.config.load import ConfigError
from reinforge.config.validate import IN_MEMORY_PREFIX
from reinforge.data import DataError, RLDataset
from reinforge.rewards.styles import ROW_KEY

TRAIN_ROWS, EVAL_ROWS = IN_MEMORY_PREFIX + "train_dataset", IN_MEMORY_PREFIX + "eval_dataset"


def dataset_rows(data: Any, name: str) -> list[dict] | str:
    """A path as a string, or the rows of a `datasets.Dataset` or a list of dicts."""
    if isinstance(data, (str, os.PathLike)):
        return os.fspath(data)
    if isinstance(data, dict):  # datasets.DatasetDict is a dict of splits
        raise DataError(f"{name}: got a dict of {sorted(data)[:4]}; pass one split, e.g. ds['train']")
    if hasattr(data, "to_list"):  # datasets.Dataset
        rows = data.to_list()
    elif isinstance(data, (list, tuple)):
        rows = list(data)
    else:
        raise DataError(f"{name}: expected a datasets.Dataset, a list of dicts or a file path, "
                        f"got {type(data).__name__}")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{name}: row {i}: expected a dict, got {type(row).__name__}")
    if not rows:
        raise DataError(f"{name}: no rows")
    return rows


def _reward_entry(item) -> dict:
    """A reward.functions entry for a callable, a spec string, (fn, weight) or a dict entry."""
    from reinforge.rewards.registry import register_python_reward

    if isinstance(item, (tuple, list)):
        item = dict(zip(("name", "weight", "style"), item))
    entry = dict(item) if isinstance(item, dict) else {"name": item}
    if callable(entry.get("name")):
        entry["name"] = register_python_reward(entry["name"])
    return entry


def python_inputs(cfg, reward_funcs=None, train_dataset=None, eval_dataset=None) -> tuple[Any, dict[str, list[dict]]]:
    """A copy of `cfg` with the Python inputs written in (reward.functions, data.train_files,
    data.val_files), and the in-memory rows by the names the data keys of the copy hold. `cfg`
    itself is left as it is."""
    if reward_funcs is not None:
        funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        cfg = replace(cfg, reward=replace(cfg.reward, functions=[_reward_entry(f) for f in funcs]))
    rows: dict[str, list[dict]] = {}
    files: dict[str, list] = {}
    for data, name, key in ((train_dataset, TRAIN_ROWS, "train_files"), (eval_dataset, EVAL_ROWS, "val_files")):
        if data is None:
            continue
        source = dataset_rows(data, name)
        if isinstance(source, str):
            files[key] = [source]
        else:
            rows[name] = source
            files[key] = [name]
    return (replace(cfg, data=replace(cfg.data, **files)) if files else cfg), rows


class InMemoryRows:
    """Mixin for an ItemsDataset: `_memory_rows`, when set, stand in for the file's rows, so they
    pass the same row checks (the tokenizer's eos check included)."""

    _memory_rows: list[dict] | None = None

    def _read(self, path, tokenizer=None, *, need_eos: bool = False) -> list[dict]:
        if self._memory_rows is None:
            return super()._read(path, tokenizer, need_eos=need_eos)
        if need_eos and tokenizer.eos_token_id is None:
            raise ValueError(f"{type(self).__name__} needs a tokenizer with an eos token")
        self.path = os.fspath(path)
        return self._memory_rows


def make_dataset(cls, source: str | list[dict], name: str, tokenizer, **kwargs):
    """cls(path, tokenizer, **kwargs) for a file, or the same over in-memory rows called `name`."""
    if isinstance(source, list):
        cls = type(cls.__name__, (InMemoryRows, cls), {"_memory_rows": source})
        return cls(name, tokenizer, **kwargs)
    return cls(source, tokenizer, **kwargs)


class PromptDataset(InMemoryRows, RLDataset):
    """RLDataset over a file or rows in memory, whose items also carry their raw row in
    extra[ROW_KEY] = (prompt column, row): TRL-style reward functions get the prompt as the row
    holds it (a message list stays one) and every column under its own name."""

    def __init__(self, source: str | list[dict], tokenizer, *, name: str | None = None, **kwargs):
        self._memory_rows = source if isinstance(source, list) else None
        super().__init__(name if self._memory_rows is not None else source, tokenizer, **kwargs)
        prompt_key = kwargs.get("prompt_key", "prompt")
        for item in self.items:
            item["extra"][ROW_KEY] = (prompt_key, self._rows[item["index"]])

    def _read(self, path, *args, **kwargs) -> list[dict]:
        self._rows = super()._read(path, *args, **kwargs)
        return self._rows


def data_source(name: str, key: str, rows: dict[str, list[dict]]) -> str | list[dict]:
    """The file path or the in-memory rows that the data key's entry `name` stands for."""
    if not name.startswith(IN_MEMORY_PREFIX):
        return name
    if name not in rows:
        raise ConfigError(f"{key}: {name!r} stands for rows handed to the trainer in Python (train_dataset=..., "
                          "eval_dataset=...); pass them that way again, or give a data file")
    return rows[name]
