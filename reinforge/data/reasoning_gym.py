"""reasoning-gym tasks as RL data: veRL-schema rows whose extra_info rebuilds the task's scorer.

    paths = make_reasoning_gym_data("chain_sum", "data/rg_chain_sum", n_train=2000, n_test=200, seed=0,
                                    options={"min_terms": 2, "max_terms": 3})
    # -> {"train": .../train.parquet, "test": .../test.parquet, "meta": .../reasoning_gym.json}

reasoning-gym (an optional extra, `pip install 'reinforge[reasoning]'`) is imported here only,
by `import_reasoning_gym`; rewards/reasoning_gym.py scores through `scorer` and `stored_entry`.

A row's extra_info holds what the task's own scorer needs: `rg_task`, `rg_options` (the task
options as JSON), `rg_seed` / `rg_index` (where reasoning-gym generated the entry) and `rg_entry`
(the entry {question, answer, metadata} as JSON). Test is drawn first: entries 0 .. n_test-1 of one
generator run, every one kept, so the held-out set is the task's own distribution. Train follows:
entries n_test, n_test+1, ... whose question is not a test question, until n_train rows (a skipped
entry is counted). The other order (train first, test questions seen in train dropped) biases the
test set where the task has few distinct questions: with chain_sum's 2-3 terms of 1 digit there are
~200 distinct 2-term questions, so 163 of 165 kept test questions were 3-term, measured.
"""
from __future__ import annotations

import difflib
import functools
import json
import os
from typing import Any

from reinforge.config.hints import did_you_mean
from reinforge.data.io import DataError, row_error, write_rows
from reinforge.data.preprocess import rl_row

EXTRA = "reasoning"  # pyproject's optional extra that installs reasoning-gym
INSTALL_HINT = f"pip install 'reinforge[{EXTRA}]'"
DEFAULT_INSTRUCTION = "Put your final answer in <answer></answer>."
SOURCE_PREFIX = "reasoning_gym/"  # data_source of the rows: reasoning_gym/<task>
ROW_KEYS = ("rg_task", "rg_options", "rg_entry")  # the extra_info keys the reward needs
TRAIN_SCAN = 4  # train looks at most n_test + 4 * n_train entries deep for questions outside test


def import_reasoning_gym():
    """The reasoning_gym module; a one-line DataError naming the extra when it is not installed."""
    try:
        import reasoning_gym
    except ImportError:
        raise DataError(f"reasoning-gym is not installed: {INSTALL_HINT}") from None
    return reasoning_gym


def task_names() -> list[str]:
    """Every task name reasoning-gym registers, sorted."""
    import_reasoning_gym()
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def _check_task(name: str) -> None:
    names = task_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"close: {', '.join(close)}; " if close else ""
        raise DataError(f"reasoning-gym has no task '{name}'; {hint}list all {len(names)} with: "
                        "reinforge data reasoning-gym --list")


def build_dataset(name: str, options: dict[str, Any], *, seed: int = 0, size: int = 1):
    """reasoning-gym's dataset `name` built with `options`; an unknown task or option, or a value
    its config refuses, is a one-line DataError."""
    _check_task(name)
    rg = import_reasoning_gym()
    for reserved in ("seed", "size"):
        if reserved in options:
            raise DataError(f"reasoning-gym option '{reserved}' is set by reinforge (--seed, --n-train + --n-test); "
                            "leave it out of the task options")
    from dataclasses import fields

    from reasoning_gym.factory import DATASETS

    known = [f.name for f in fields(DATASETS[name][1]) if f.name not in ("seed", "size")]
    for key in options:
        if key not in known:
            raise DataError(f"reasoning-gym task '{name}' has no option '{key}'; {did_you_mean(key, known)}"
                            f"options: {', '.join(known)}")
    try:
        return rg.create_dataset(name, seed=seed, size=size, **options)
    except (AssertionError, TypeError, ValueError) as exc:  # the config's own checks (asserts, mostly)
        raise DataError(f"reasoning-gym task '{name}' refused options {options}: {exc or type(exc).__name__}") \
            from None


@functools.lru_cache(maxsize=64)
def scorer(name: str, options_json: str):
    """The score_answer of task `name` built with the JSON-encoded options; one dataset object
    per (task, options) in a process (some build word lists or tables when constructed)."""
    return build_dataset(name, json.loads(options_json)).score_answer


def _plain(value: Any):
    """JSON's stand-in for what it cannot write (a Fraction, a set): its str. Whether the task's
    scorer still scores the stored entry as the original is checked per entry (_rows)."""
    return sorted(map(str, value)) if isinstance(value, (set, frozenset)) else str(value)


def entry_json(entry: dict) -> str:
    """An entry {question, answer, metadata} as the JSON that rows store."""
    return json.dumps({k: entry[k] for k in ("question", "answer", "metadata")}, sort_keys=True, default=_plain)


def stored_entry(extra_info: Any, path: str = "<rows>", i: int = 0) -> tuple[str, str, dict]:
    """(task, options JSON, entry) from a row's extra_info; a DataError naming the file, row and
    missing key when the row was not written by make_reasoning_gym_data."""
    if not isinstance(extra_info, dict):
        raise row_error(path, i, "extra_info", "missing: the reasoning_gym reward needs rows written by "
                                               "`reinforge data reasoning-gym`")
    for key in ROW_KEYS:
        if not isinstance(extra_info.get(key), str) or not extra_info[key]:
            raise row_error(path, i, f"extra_info.{key}", "missing or not a string: the reasoning_gym reward "
                                                          "needs rows written by `reinforge data reasoning-gym`")
    try:
        entry = json.loads(extra_info["rg_entry"])
        json.loads(extra_info["rg_options"])
    except json.JSONDecodeError as exc:
        raise row_error(path, i, "extra_info.rg_entry", f"not JSON: {exc}") from None
    return extra_info["rg_task"], extra_info["rg_options"], entry


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("reasoning-gym")
    except PackageNotFoundError:  # installed from source without metadata
        return "unknown"


def _prompt(question: str, instruction: str, system: str) -> list[dict]:
    user = f"{question}\n{instruction}" if instruction else question
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]


def _rows(name: str, ds, options_json: str, seed: int, indices, split: str, instruction: str,
          system: str) -> list[dict]:
    """RL rows of entries `indices`, each checked to score its own answer the same from the stored
    JSON as from the generated entry (a task whose metadata JSON cannot carry is refused)."""
    rows = []
    for k, idx in enumerate(indices):
        entry = ds[idx]
        stored = entry_json(entry)
        gold = None if entry["answer"] is None else str(entry["answer"])
        if ds.score_answer(answer=gold, entry=entry) != ds.score_answer(answer=gold, entry=json.loads(stored)):
            raise DataError(f"reasoning-gym task '{name}': entry {idx}'s metadata does not survive JSON storage "
                            "(its scorer scores the stored entry differently); this task cannot be used")
        extra = {"rg_task": name, "rg_options": options_json, "rg_seed": seed, "rg_index": idx, "rg_entry": stored}
        rows.append(rl_row(SOURCE_PREFIX + name, _prompt(entry["question"], instruction, system), "reasoning",
                           gold or "", split, k, extra))
    return rows


def sft_rows(rows: list[dict], instruction: str) -> list[dict]:
    """Chat SFT rows {"messages": the row's prompt + an assistant turn with the gold answer} of
    the RL rows that have one: `<answer>GOLD</answer>` when the instruction asks for the tag (the
    default), else the answer alone; the reply the reward scores 1."""
    tagged = "<answer>" in (instruction or "")
    return [{"messages": [*r["prompt"], {"role": "assistant", "content": f"<answer>{gold}</answer>" if tagged
                                         else gold}]}
            for r in rows if (gold := r["reward_model"]["ground_truth"])]


def make_reasoning_gym_data(name: str, out_dir: str, *, n_train: int = 2000, n_test: int = 200, seed: int = 0,
                            instruction: str = DEFAULT_INSTRUCTION, system: str = "",
                            options: dict[str, Any] | None = None) -> dict:
    """Write train.parquet and test.parquet of reasoning-gym task `name` (with its `options`) to
    out_dir, sft.parquet (sft_rows: the train prompts answered with the gold answer, for SFT on
    chat rows), and reasoning_gym.json (task, options, seed, row counts, train entries skipped for
    asking a test question). Test first, then train (module docstring). Returns {"train", "test",
    "sft", "meta": paths, "skipped": int}."""
    options = dict(options or {})
    if n_train < 1 or n_test < 1:
        raise DataError(f"--n-train and --n-test must be >= 1, got {n_train} and {n_test}")
    scan = n_test + TRAIN_SCAN * n_train  # how far train may look past the test entries
    ds = build_dataset(name, options, seed=seed, size=scan)
    options_json = json.dumps(options, sort_keys=True)
    test = _rows(name, ds, options_json, seed, range(n_test), "test", instruction, system)
    held = {json.loads(r["extra_info"]["rg_entry"])["question"] for r in test}
    picked = [i for i in range(n_test, scan) if ds[i]["question"] not in held][:n_train]
    if len(picked) < n_train:
        raise DataError(f"reasoning-gym task '{name}': only {len(picked)} of {scan - n_test} entries after the "
                        f"{n_test} test entries ask a question outside the test set, fewer than --n-train "
                        f"{n_train}; the task has too few distinct questions with these options (lower --n-test)")
    train = _rows(name, ds, options_json, seed, picked, "train", instruction, system)
    skipped = picked[-1] + 1 - n_test - n_train
    paths = {"train": write_rows(train, os.path.join(out_dir, "train.parquet")),
             "test": write_rows(test, os.path.join(out_dir, "test.parquet")),
             "sft": write_rows(sft_rows(train, instruction), os.path.join(out_dir, "sft.parquet"))}
    meta = {"task": name, "options": options, "seed": seed, "n_train": len(train), "n_test": len(test),
            "train_skipped_in_test": skipped, "split": "test first", "instruction": instruction,
            "system": system, "reasoning_gym": _version()}
    paths["meta"] = os.path.join(out_dir, "reasoning_gym.json")
    with open(paths["meta"], "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
    return {**paths, "skipped": skipped}
