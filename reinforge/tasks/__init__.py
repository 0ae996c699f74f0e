"""Built-in synthetic tasks with verifiable answers, reproducible from a seed.

    task = get_task("arithmetic", digits=2)
    paths = make_task_data("arithmetic", "data/arith", n_train=2000, n_test=200, n_sft=2000, seed=0)
    # -> {"train": .../train.parquet, "test": ..., "sft": ..., "prefs": ..., "meta": .../task.json}

RL rows follow veRL's schema with a plain-text prompt: data_source, prompt, ability,
reward_model {"style": "rule", "ground_truth"}, extra_info {"split", "index"}. A visual task's
rows (count_shapes) follow veRL's multimodal schema instead: the prompt is one user message whose
text starts with an `<image>` placeholder per image, and `images` holds [{"bytes": PNG, "path": None}]
(every row file: train, test, sft, prefs).
"""

from __future__ import annotations

import inspect
import json
import os
import random
from typing import Any, Callable

from reinforge.config.hints import did_you_mean
from reinforge.data.io import DataError, write_rows
from reinforge.data.preprocess import rl_row
from reinforge.tasks.arithmetic import make_arithmetic
from reinforge.tasks.base import Example, Task
from reinforge.tasks.calculator import make_calculator
from reinforge.tasks.count_shapes import make_count_shapes
from reinforge.tasks.countdown import make_countdown, score_countdown
from reinforge.tasks.guess_number import make_guess_number
from reinforge.tasks.long_addition import make_long_addition

TASKS: dict[str, Callable[..., Task]] = {
    "arithmetic": make_arithmetic, "countdown": make_countdown, "long_addition": make_long_addition,
    "calculator": make_calculator, "guess_number": make_guess_number, "count_shapes": make_count_shapes,
}

__all__ = [
    "TASKS", "Task", "Example", "get_task", "make_task_data", "build_char_tokenizer",
    "score_countdown",
]


def build_char_tokenizer(save_dir: str | None = None):
    """See reinforge.tasks.tokenizer; imported on use so reward workers need not load transformers."""
    from reinforge.tasks.tokenizer import build_char_tokenizer as build

    return build(save_dir)


def task_options(name: str) -> dict[str, Any]:
    """The options of task `name` with their defaults, e.g. {"digits": 2, "ops": "+"}."""
    return {p.name: p.default for p in inspect.signature(TASKS[name]).parameters.values()}


def get_task(name: str, **task_kwargs) -> Task:
    """Build the task `name` with its options. Unknown names and options, and values of the wrong
    type or range, raise DataError listing what is valid."""
    if name not in TASKS:
        raise DataError(f"unknown task '{name}'; {did_you_mean(name, TASKS)}available: {', '.join(sorted(TASKS))}")
    options = task_options(name)
    listed = ", ".join(f"{k}={v!r}" for k, v in options.items())
    for key, value in task_kwargs.items():
        if key not in options:
            raise DataError(f"task '{name}' has no option '{key}'; {did_you_mean(key, options)}options: {listed}")
        want = type(options[key])
        if isinstance(value, bool) or not isinstance(value, (int, float) if want is float else want):
            kind = {int: "an integer", float: "a number", str: "a string"}.get(want, want.__name__)
            raise DataError(f"{name}: option {key}={value!r} must be {kind} (default {options[key]!r})")
    try:
        return TASKS[name](**task_kwargs)
    except ValueError as exc:  # the task's own range checks
        raise DataError(str(exc)) from None


def _key(ex: Example) -> tuple:
    """What makes two examples the same problem: the prompt text and the images (a visual task's
    prompts all have the same text)."""
    return ex.prompt, ex.images


def _prompt_columns(ex: Example) -> dict[str, Any]:
    """The prompt of a row: plain text, or for an example with images veRL's multimodal form,
    one user message with an `<image>` placeholder per image, and the `images` column."""
    if not ex.images:
        return {"prompt": ex.prompt}
    from reinforge.data.images import IMAGE_PLACEHOLDER

    return {"prompt": [{"role": "user", "content": IMAGE_PLACEHOLDER * len(ex.images) + ex.prompt}],
            "images": [{"bytes": b, "path": None} for b in ex.images]}


def _draw_unique(task: Task, rng: random.Random, n: int, exclude: set) -> list[Example]:
    """`n` examples with distinct prompts (text and images) not in `exclude`, drawn in rng order."""
    seen, out = set(exclude), []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 100 * n + 10_000:
            raise ValueError(f"{task.name}: could not draw {n} distinct prompts; the task space is too small")
        ex = task.sample(rng)
        if _key(ex) not in seen:
            seen.add(_key(ex))
            out.append(ex)
    return out


def make_task_data(
    name: str, out_dir: str, *, n_train: int = 2000, n_test: int = 200, n_sft: int = 2000, seed: int = 0, **task_kwargs
) -> dict[str, str]:
    """Write train/test/sft/prefs parquet files (and task.json) for a built-in task.

    The test prompts are disjoint from train and SFT prompts; train and SFT are drawn
    independently from the remaining prompts (they may overlap). Preference pairs use the SFT
    prompts: chosen is the correct answer, rejected a plausible wrong one. Same arguments, same
    files, byte for byte in content.
    """
    task = get_task(name, **task_kwargs)
    if min(n_train, n_test, n_sft) < 0:
        raise DataError("n_train, n_test and n_sft must be >= 0")
    if task.size is not None and n_test + max(n_train, n_sft) > task.size:
        raise DataError(
            f"{name} with {task.options} has only {task.size} distinct prompts; "
            f"n_test + max(n_train, n_sft) = {n_test + max(n_train, n_sft)} is too many"
        )
    rng = random.Random(f"reinforge-task:{name}:{seed}")  # str seeds hash the same in every process
    test = _draw_unique(task, rng, n_test, set())
    test_prompts = {_key(ex) for ex in test}
    train = _draw_unique(task, rng, n_train, test_prompts)
    sft = _draw_unique(task, rng, n_sft, test_prompts)

    paths = {}
    for split, examples in (("train", train), ("test", test)):
        rows = [{**rl_row(task.name, ex.prompt, task.ability, ex.ground_truth, split, i), **_prompt_columns(ex),
                 **task.row_columns} for i, ex in enumerate(examples)]
        paths[split] = write_rows(rows, os.path.join(out_dir, f"{split}.parquet"))
    info = [{"split": "sft", "index": i} for i in range(len(sft))]
    sft_rows = [
        {"data_source": name,
         **(task.sft_row(ex) if task.sft_row else {**_prompt_columns(ex), "response": ex.answer}),
         "ground_truth": ex.ground_truth, "extra_info": x}
        for ex, x in zip(sft, info)
    ]
    pref_rows = [
        {"data_source": name, **_prompt_columns(ex), "chosen": ex.answer, "rejected": ex.wrong,
         "ground_truth": ex.ground_truth}
        for ex in sft
    ]
    paths["sft"] = write_rows(sft_rows, os.path.join(out_dir, "sft.parquet"))
    paths["prefs"] = write_rows(pref_rows, os.path.join(out_dir, "prefs.parquet"))
    meta = {"task": name, "options": task.options, "seed": seed, "n_train": n_train, "n_test": n_test, "n_sft": n_sft}
    paths["meta"] = os.path.join(out_dir, "task.json")
    with open(paths["meta"], "w") as f:
        json.dump(meta, f, indent=2)
    return paths
