"""Built-in reward functions: fn(prompt, response, ground_truth, **extra) -> float."""

from __future__ import annotations

import re
import signal
import threading

from reinforge.data.preprocess import gsm8k_answer

MAX_MATH_CHARS = 4096  # math_verify's regexes are slow on huge strings; the answer sits at the end
# One math_verify call (both parses and the comparison) on the main thread. Real answers take
# 1-200 ms (the first \sqrt or \frac of a process ~0.2 s); sympy can spend minutes on
# "10^{10^{10}}" or deep nesting, so past this a call scores 0 instead of stalling the batch.
MATH_VERIFY_BUDGET_S = 0.8

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


# Linear-time in the response (one strip / one lazy regex; fuzzed at 100 kB in microseconds), so
# RewardManager may run them in the trainer process without a worker round trip.
exact_match.bounded = format_reward.bounded = True


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


class _OverBudget(BaseException):
    """Raised by the budget alarm. Not an Exception, so the `except Exception` fallbacks inside
    sympy and math_verify cannot swallow it and carry on unbounded."""


def _over_budget(signum, frame):
    raise _OverBudget


def _math_verify(gold_text: str, answer_text: str) -> float:
    from math_verify import parse, verify  # imported lazily: sympy takes ~1 s to import

    # Their own timeouts are off (None): they would re-arm SIGALRM in whole seconds under ours.
    gold = parse(gold_text, parsing_timeout=None)
    pred = parse(answer_text, parsing_timeout=None)
    if not gold or not pred:
        return 0.0
    return 1.0 if verify(gold, pred, timeout_seconds=None) else 0.0


def math_verify_reward(prompt: str, response: str, ground_truth, **extra) -> float:
    """1.0 when math_verify judges the response's final answer equal to the ground truth.

    Ground truth may be "42" or "\\boxed{42}"; the response's answer is its last \\boxed{}
    or the text after "####", else the last expression math_verify extracts.
    On the main thread a call past MATH_VERIFY_BUDGET_S scores 0 (a SIGALRM timer, ITIMER_REAL);
    other threads cannot take signals, so there the caller's timeout (RewardManager's worker
    processes, whose calls run on their main thread) is the only bound.
    """
    if not isinstance(response, str) or not response.strip():
        return 0.0
    gold_text, answer_text = _gold_text(ground_truth), _answer_text(response)
    if threading.current_thread() is not threading.main_thread():
        return _math_verify(gold_text, answer_text)
    previous = signal.signal(signal.SIGALRM, _over_budget)
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, MATH_VERIFY_BUDGET_S)
            return _math_verify(gold_text, answer_text)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _OverBudget:  # also when the alarm lands in the inner finally: the timer is spent then
        return 0.0
    finally:
        signal.signal(signal.SIGALRM, previous)


# Reward worker processes import these before their first call (sympy takes ~1 s), so that the
# import is not charged to the first call's timeout.
math_verify_reward.preload_modules = ("math_verify",)
