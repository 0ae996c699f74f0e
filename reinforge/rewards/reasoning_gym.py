"""The `reasoning_gym` reward: a reasoning-gym task's own scorer on the reply's extracted answer.

Rows come from `reinforge data reasoning-gym` (data/reasoning_gym.py): their extra_info names the
task, its options and the stored entry, from which the scorer is rebuilt (one dataset object per
task and options in a process) and called as score_answer(answer=extracted, entry=entry).

The extraction rule (extract_answer), in this order:
1. the content of the last `<answer>...</answer>` in the reply, stripped (the prompt asks for it);
2. else, when the ground truth is a number, the last number in the reply ("-3", "2.5", "1,024"
   read as "1024");
3. else the whole reply, stripped; an empty reply extracts nothing (None), which scores 0.
"""
from __future__ import annotations

import re

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_IS_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
# A sample counts as correct (eval's acc) when the task scores it at least this: reasoning-gym
# scorers give 1.0 for a right answer and partial credit (e.g. 0.01-0.5) for near misses.
CORRECT_SCORE = 1.0 - 1e-6


def extract_answer(response: str, ground_truth=None) -> str | None:
    """The answer in `response` by the module's extraction rule; None when there is none."""
    if not isinstance(response, str) or not response.strip():
        return None
    tags = _ANSWER_TAG.findall(response)
    if tags:
        return tags[-1].strip()
    if ground_truth is not None and _IS_NUMBER.fullmatch(str(ground_truth).strip()):
        numbers = _NUMBER.findall(response)
        if numbers:
            return numbers[-1].replace(",", "")
    return response.strip()


def reasoning_gym_reward(prompt: str, response: str, ground_truth, extra_info=None, **extra) -> dict:
    """{"score": the task's score_answer in [0, 1], "acc": score == 1}; a scorer that raises on a
    malformed answer scores 0. A row without the stored entry is a DataError naming the key."""
    from reinforge.data.reasoning_gym import scorer, stored_entry

    task, options, entry = stored_entry(extra_info)
    score_answer = scorer(task, options)  # outside the try: a missing extra or bad task is the user's error
    answer = extract_answer(response, ground_truth)
    try:
        score = float(score_answer(answer=answer, entry=entry))
    except Exception:  # a task's scorer on text it cannot parse: a wrong answer, not a crash
        score = 0.0
    return {"score": score, "acc": score >= CORRECT_SCORE}


def check_rows(rows: list[dict], path: str) -> None:
    """DataError naming the file, row and key of the first row this reward cannot score, or the
    one line naming the extra when reasoning-gym is not installed."""
    from reinforge.data.io import row_error
    from reinforge.data.reasoning_gym import stored_entry, task_names

    tasks = set(task_names())  # the missing-extra line, first
    for i, row in enumerate(rows):
        task, _, _ = stored_entry(row.get("extra_info"), path, i)
        if task not in tasks:
            raise row_error(path, i, "extra_info.rg_task", f"reasoning-gym has no task '{task}' (this install)")


reasoning_gym_reward.preload_modules = ("reasoning_gym",)
reasoning_gym_reward.check_rows = check_rows
