"""Data files that are `datasets` datasets: a Hub dataset or a `save_to_disk` folder.

    hf://datasets/ORG/NAME[@REVISION][:CONFIG][:SPLIT]   e.g. hf://datasets/openai/gsm8k:main:train
    FOLDER[:SPLIT]                                       a Dataset or DatasetDict save_to_disk folder

With one part after the id it is the split (`hf://datasets/trl-lib/tldr:train`); with two, the
config and the split. A split may be left out when there is only one. A Hub dataset goes through
`datasets.load_dataset` and its cache (HF_HOME, HF_DATASETS_CACHE; HF_HUB_OFFLINE=1 reads the
cache only). `datasets` is imported only when such a path is used: it is slow to import.
"""
from __future__ import annotations

import os
import re
from typing import Any, Optional

from reinforge.data.io import DataError

HF_PREFIX = "hf://datasets/"
_HF_SPEC = re.compile(r"(?P<repo>[\w.-]+/[\w.-]+)(?:@(?P<rev>[\w./-]+))?((?::(?P<a>[\w.-]+))(?::(?P<b>[\w.-]+))?)?")
SAVED_MARKERS = ("state.json", "dataset_dict.json")  # what Dataset / DatasetDict.save_to_disk write


def parse_hf_spec(spec: str) -> tuple[str, Optional[str], Optional[str], Optional[str]]:
    """(repo id, revision, config, split) of an hf://datasets/ path; DataError when malformed."""
    m = _HF_SPEC.fullmatch(spec[len(HF_PREFIX):])
    if not spec.startswith(HF_PREFIX) or not m:
        raise DataError(f"{spec}: not a Hub dataset path; write {HF_PREFIX}ORG/NAME[@REVISION][:CONFIG][:SPLIT], "
                        f"e.g. {HF_PREFIX}openai/gsm8k:main:train")
    config, split = (m["a"], m["b"]) if m["b"] else (None, m["a"])
    return m["repo"], m["rev"], config, split


def saved_folder(path: str) -> Optional[tuple[str, Optional[str]]]:
    """(folder, split or None) when `path` is a save_to_disk folder, optionally with :SPLIT."""
    for folder, split in ((path, None), tuple(path.rsplit(":", 1)) if ":" in path else (None, None)):
        if folder and os.path.isdir(folder) and any(os.path.isfile(os.path.join(folder, m)) for m in SAVED_MARKERS):
            return folder, split
    return None


def is_dataset_source(path: str) -> bool:
    """Whether `path` names a `datasets` dataset (read by load_dataset_rows) rather than a file."""
    return str(path).startswith(HF_PREFIX) or saved_folder(str(path)) is not None


def source_name(path: str) -> str:
    """A short name for rows without data_source: the Hub repo id, or the file or folder's stem."""
    if path.startswith(HF_PREFIX):
        return parse_hf_spec(path)[0]
    folder = saved_folder(path)
    return os.path.basename(os.path.normpath(folder[0] if folder else os.path.splitext(path)[0]))


def _pick_split(data, split: Optional[str], spec: str):
    """The Dataset `split` of a DatasetDict (the only one when `split` is None)."""
    if not hasattr(data, "keys"):  # a single Dataset
        if split:
            raise DataError(f"{spec}: a single Dataset has no splits; drop ':{split}'")
        return data
    names = list(data.keys())
    if split is None and len(names) == 1:
        return data[names[0]]
    if split not in names:
        what = f"no split {split!r}" if split else "more than one split"
        raise DataError(f"{spec}: {what}; splits: {', '.join(names)} (name one with :SPLIT)")
    return data[split]


def _load_hub(spec: str):
    import datasets
    from datasets.exceptions import DatasetNotFoundError

    repo, revision, config, split = parse_hf_spec(spec)
    try:
        data = datasets.load_dataset(repo, config, revision=revision)
    except DatasetNotFoundError as exc:
        raise DataError(f"{spec}: {exc} Log in (`hf auth login`) for a private or gated dataset.") from None
    except ConnectionError:
        raise DataError(f"{spec}: not in the datasets cache ({datasets.config.HF_DATASETS_CACHE}) and the Hub cannot "
                        "be reached (HF_HUB_OFFLINE=1 or no network): load it once online, or point HF_HOME / "
                        "HF_DATASETS_CACHE at the cache that holds it") from None
    except ValueError as exc:  # a config name missing or unknown: the message lists the configs
        first = (str(exc).strip().splitlines() or [""])[0]
        raise DataError(f"{spec}: {first} (name the config: {HF_PREFIX}{repo}:CONFIG:SPLIT)") from None
    return _pick_split(data, split, spec)


def load_dataset_rows(path: str) -> list[dict[str, Any]]:
    """The rows of a Hub dataset or save_to_disk folder (see the module's doc) as plain dicts."""
    if path.startswith(HF_PREFIX):
        data = _load_hub(path)
    else:
        import datasets

        folder, split = saved_folder(path)
        try:
            data = datasets.load_from_disk(folder)
        except Exception as exc:  # a damaged folder: arrow, json and fsspec errors
            raise DataError(f"{path}: cannot read the saved dataset: {type(exc).__name__}: {exc}") from exc
        data = _pick_split(data, split, path)
    return data.to_list()
