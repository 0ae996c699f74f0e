"""Built-in reward functions: fn(prompt, response, ground_truth, **extra) -> float."""

from __future__ import annotations

import re
import threading

from reinforge.data.preprocess import gsm8k_answer

MAX_MATH_CHARS = 4096  # math_verify's regexes are slow on huge strings; the answer sits at the end

_THINK = re.compile(r"\s*<think>(.*?)</think>(.*)", re.DOTALL)


def exact_match(prompt: str, response: str, ground_truth, **extra) -> float:
    """1.0 when the stripped response equals the stripped ground truth (as a string)."""
    return 1.0 if isinstance(response, str) and response.strip() == str(ground_truth).strip() else 0.0


def format_reward(prompt: str, response: str, ground_truth=None, **extra) -> float:
    """1.0 for "<think>...</think>" followed by a non-empty answer (with no second <think>)."""
    if not isinstance(response, str):
        return 0.0
    m = _THINK.fullmatch(response)
    if m is None:
        return 0.0
    answer = m.group(2)
    return 1.0 if answer.strip() and "<think>" not in answer and "</think>" not in answer else 0.0


def soft_overlong_punishment(length: int, max_len: int, buffer_len: int, factor: float = 1.0) -> float:
    """DAPO's soft overlong penalty for a response of `length` tokens (added to the score).

    0 up to max_len - buffer_len, then linear down to -factor at max_len, and -factor beyond
    (arXiv:2503.14476, eq. 13).
    """
    if buffer_len <= 0 or buffer_len > max_len:
        raise ValueError(f"need 0 < buffer_len <= max_len, got buffer_len={buffer_len}, max_len={max_len}")
    expected = max_len - buffer_len
    if length <= expected:
        return 0.0
    if length <= max_len:
        return (expected - length) / buffer_len * factor
    return -float(factor)


def _gold_text(ground_truth) -> str:
    gt = str(ground_truth).strip()
    # Wrapping in \boxed makes math_verify read LaTeX ("\frac{1}{2}") and plain numbers alike.
    return gt if "\\boxed" in gt else "\\boxed{" + gt + "}"


def _answer_text(response: str) -> str:
    text = response[-MAX_MATH_CHARS:]
    if "\\boxed" not in text and "####" in text:
        # GSM8K style: the answer follows the last "####"; box it so it wins over other numbers
        # (an empty answer gives an empty box, which scores 0).
        text = "\\boxed{" + (gsm8k_answer(text) or "") + "}"
    return text


def math_verify_reward(prompt: str, response: str, ground_truth, **extra) -> float:
    """1.0 when math_verify judges the response's final answer equal to the ground truth.

    Ground truth may be "42" or "\\boxed{42}"; the response's answer is its last \\boxed{}
    or the text after "####", else the last expression math_verify extracts.
    math_verify times out with SIGALRM, which only the main thread may use: off the main
    thread its timeouts are disabled and the caller's timeout (RewardManager) applies.
    """
    if not isinstance(response, str) or not response.strip():
        return 0.0
    from math_verify import parse, verify  # imported lazily: sympy takes ~1 s to import

    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(_gold_text(ground_truth), parsing_timeout=timeout)
    pred = parse(_answer_text(response), parsing_timeout=timeout)
    if not gold or not pred:
        return 0.0
    return 1.0 if verify(gold, pred, timeout_seconds=timeout) else 0.0


# Reward worker processes import these before their first call (sympy takes ~1 s), so that the
# import is not charged to the first call's timeout.
math_verify_reward.preload_modules = ("math_verify",)
