"""Convert raw GSM8K / MATH files into veRL-schema RL rows (chat-message prompts)."""

from __future__ import annotations

import os

from reinforge.data.io import DataError, load_rows, row_error, write_rows

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


def _rl_row(source: str, question: str, instruction: str, gt: str, split: str, index: int, extra: dict) -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": f"{question} {instruction}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": gt},
        "extra_info": {"split": split, "index": index, **extra},
    }


def _field(row: dict, key: str, path: str, i: int) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise row_error(path, i, key, "missing, empty or not a string")
    return value


def preprocess_gsm8k(in_path: str, out_path: str, *, split: str | None = None) -> str:
    """Raw GSM8K rows {"question", "answer": "...#### 42"} -> veRL rows, ground truth "42"."""
    split = split or os.path.splitext(os.path.basename(out_path))[0]
    out = []
    for i, row in enumerate(load_rows(in_path)):
        question, solution = _field(row, "question", in_path, i), _field(row, "answer", in_path, i)
        gt = gsm8k_answer(solution)
        if gt is None:
            raise row_error(in_path, i, "answer", "no '#### <answer>' in the solution")
        extra = {"answer": solution, "question": question}
        out.append(_rl_row("openai/gsm8k", question, GSM8K_INSTRUCTION, gt, split, i, extra))
    if not out:
        raise DataError(f"{in_path}: no rows")
    return write_rows(out, out_path)


def preprocess_math(in_path: str, out_path: str, *, split: str | None = None) -> str:
    """Raw MATH rows {"problem", "solution" with \\boxed{...}} -> veRL rows, ground truth the boxed content."""
    split = split or os.path.splitext(os.path.basename(out_path))[0]
    out = []
    for i, row in enumerate(load_rows(in_path)):
        problem, solution = _field(row, "problem", in_path, i), _field(row, "solution", in_path, i)
        gt = last_boxed(solution)
        if not gt:
            raise row_error(in_path, i, "solution", "no balanced \\boxed{...} answer")
        extra = {k: row[k] for k in ("level", "type") if isinstance(row.get(k), str)}
        out.append(_rl_row("math", problem, MATH_INSTRUCTION, gt, split, i, extra))
    if not out:
        raise DataError(f"{in_path}: no rows")
    return write_rows(out, out_path)
