"""Built-in reward functions: fn(prompt, response, ground_truth, **extra) -> float."""

from __future__ import annotations

import functools
import logging
import re
import signal
import threading

from reinforge.data.preprocess import gsm8k_answer

# math_verify's regexes are slow on huge strings (seconds in C at 100 kB, past any alarm): a
# response is read from its last MAX_MATH_CHARS (the answer sits at the end), and a longer
# ground truth, which is no final answer, scores 0.
MAX_MATH_CHARS = 4096
# One math_verify call (both parses and the comparison) on the main thread. Real answers take
# 1-300 ms (the slow ones: a construct's first parse in a process, e.g. \log or \sin); sympy
# can spend minutes on "10^{10^{10}}" or deep nesting, so past this a call scores 0 instead of
# stalling the batch.
MATH_VERIFY_BUDGET_S = 0.8
# Exponents nested this deep (10^{10^{10^{10}}}, 9**9**9**9) score 0 unparsed: sympy's evalf of
# such a tower spends seconds in one big-integer shift in C, where no alarm can interrupt it.
# Three levels (2^{2^{3}}) still parse.
MAX_POWER_DEPTH = 2
_POWER_CHAIN = re.compile(r"(?:\*\*\s*[\w.]+\s*){%d,}" % (MAX_POWER_DEPTH + 1))

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


def _power_depth(text: str) -> int:
    """How deep exponents nest in LaTeX: "2^{3}" 1, "2^{3^{4}}" 2, "2^{3^4}" 2; one linear scan."""
    depth = deepest = 0
    groups: list[bool] = []  # one per open brace: does it hold an exponent?
    after_caret = False
    for ch in text:
        if ch == "^":
            deepest = max(deepest, depth + 1)
            after_caret = True
        elif ch == "{":
            groups.append(after_caret)
            depth += after_caret
            after_caret = False
        elif ch == "}":
            if groups and groups.pop():
                depth -= 1
        elif not ch.isspace():
            after_caret = False
    return deepest


def _too_deep(text: str) -> bool:
    return _power_depth(text) > MAX_POWER_DEPTH or _POWER_CHAIN.search(text) is not None


class _OverBudget(BaseException):
    """Raised by the budget alarm. Not an Exception, so the `except Exception` fallbacks inside
    sympy and math_verify cannot swallow it and carry on unbounded."""


_BUDGET_ARMED = False  # lowered first thing on the way out, so a late alarm is a no-op


def _over_budget(signum, frame):
    if _BUDGET_ARMED:
        raise _OverBudget


@functools.cache
def _math_verify_fns():
    """math_verify's (parse, verify), imported and run once on a fixed answer outside any budget:
    the import (sympy, ~1 s) and a process's first \\frac / \\sqrt parse (~0.4 s) are one-off
    costs, not the answer's. Their own timeouts stay off (None; they would re-arm SIGALRM in whole
    seconds under ours), so their one-time "timeout is disabled" warning is muted here."""
    from math_verify import parse, verify

    log = logging.getLogger("math_verify")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        verify(parse("\\boxed{\\frac{\\sqrt{2}}{2}}", parsing_timeout=None), parse("0.5", parsing_timeout=None),
               timeout_seconds=None)
    finally:
        log.setLevel(level)
    return parse, verify


def _math_verify(gold_text: str, answer_text: str) -> float:
    parse, verify = _math_verify_fns()
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
    if len(gold_text) > MAX_MATH_CHARS or _too_deep(gold_text) or _too_deep(answer_text):
        return 0.0
    _math_verify_fns()  # the one-off import and warm-up, before the budget starts
    if threading.current_thread() is not threading.main_thread():
        return _math_verify(gold_text, answer_text)
    global _BUDGET_ARMED
    previous = signal.signal(signal.SIGALRM, _over_budget)
    try:
        _BUDGET_ARMED = True
        # Then every 50 ms: a bare `except:` somewhere in sympy that swallowed one alarm gets the next.
        signal.setitimer(signal.ITIMER_REAL, MATH_VERIFY_BUDGET_S, 0.05)
        return _math_verify(gold_text, answer_text)
    except _OverBudget:
        return 0.0
    finally:
        # The flag store comes before any call: CPython runs signal handlers only at calls and
        # backward jumps, so an alarm that lands from here on finds the flag down.
        _BUDGET_ARMED = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# Reward worker processes import these and warm up before their first call (sympy takes ~1 s to
# import, a first parse ~0.4 s), so that neither is charged to the first call's timeout.
math_verify_reward.preload_modules = ("math_verify",)
math_verify_reward.warm_up = _math_verify_fns
