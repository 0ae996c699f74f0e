"""Convert raw GSM8K / MATH files into veRL-schema RL rows (chat-message prompts)."""

from __future__ import annotations

import os

from reinforge.data.io import load_rows, row_error, write_rows

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def gsm8k_answer(solution: str) -> str | None:
    """The final answer after the last '####' (thousands commas removed), or None."""
    if "####" not in solution:
        return None
    answer = solution.rsplit("####", 1)[1].strip().replace(",", "")
    return answer or None


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}), matching nested braces; None if absent/unbalanced."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:].removeprefix("\\boxed").removeprefix("\\fbox")
    if rest.startswith(" ") and rest.strip():
        return rest.split()[0].split("$")[0] or None  # "\boxed 5": brace-less single token
    if not rest.startswith("{"):
        return None
    i = len(text) - len(rest)
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None  # unbalanced


def rl_row(source: str, prompt, ability: str, ground_truth, split: str, index: int, extra: dict | None = None) -> dict:
    """A veRL-schema RL row: data_source, prompt, ability, reward_model {"style": "rule",
    "ground_truth"}, extra_info {"split", "index", **extra}."""
    return {
        "data_source": source,
        "prompt": prompt,
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, **(extra or {})},
    }


def _field(row: dict, key: str, path: str, i: int) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise row_error(path, i, key, "missing, empty or not a string")
    return value


def _convert(in_path: str, out_path: str, split: str | None, row_fn) -> str:
    """Write row_fn(raw row, in_path, i, split) for every row of in_path to out_path; split
    defaults to out_path's file name without extension ("train.parquet" -> "train")."""
    split = split or os.path.splitext(os.path.basename(out_path))[0]
    rows = load_rows(in_path, nonempty=True)
    return write_rows([row_fn(row, in_path, i, split) for i, row in enumerate(rows)], out_path)


def _gsm8k_row(row: dict, path: str, i: int, split: str) -> dict:
    question, solution = _field(row, "question", path, i), _field(row, "answer", path, i)
    gt = gsm8k_answer(solution)
    if gt is None:
        raise row_error(path, i, "answer", "no '#### <answer>' in the solution")
    prompt = [{"role": "user", "content": f"{question} {GSM8K_INSTRUCTION}"}]
    return rl_row("openai/gsm8k", prompt, "math", gt, split, i, {"answer": solution, "question": question})


def _math_row(row: dict, path: str, i: int, split: str) -> dict:
    problem, solution = _field(row, "problem", path, i), _field(row, "solution", path, i)
    gt = last_boxed(solution)
    if not gt:
        raise row_error(path, i, "solution", "no balanced \\boxed{...} answer")
    extra = {k: row[k] for k in ("level", "type") if isinstance(row.get(k), str)}
    prompt = [{"role": "user", "content": f"{problem} {MATH_INSTRUCTION}"}]
    return rl_row("math", prompt, "math", gt, split, i, extra)


def preprocess_gsm8k(in_path: str, out_path: str, *, split: str | None = None) -> str:
    """Raw GSM8K rows {"question", "answer": "...#### 42"} -> veRL rows, ground truth "42"."""
    return _convert(in_path, out_path, split, _gsm8k_row)


def preprocess_math(in_path: str, out_path: str, *, split: str | None = None) -> str:
    """Raw MATH rows {"problem", "solution" with \\boxed{...}} -> veRL rows, ground truth the boxed content."""
    return _convert(in_path, out_path, split, _math_row)
