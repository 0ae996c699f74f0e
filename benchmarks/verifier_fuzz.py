"""Built-in verifiers under fuzz: crashes, time-outs and the slowest calls.

    python benchmarks/verifier_fuzz.py            # 10,000 generated responses per verifier
    python benchmarks/verifier_fuzz.py --n 500    # a quicker run

Each verifier (math_verify, exact_match, format, countdown, arithmetic) scores `--n` generated
responses against generated ground truths, called directly in this process (the main thread,
as in a reward worker), one call at a time. A crash is any exception or a score other than
0 or 1; a time-out is a call slower than `--budget` seconds (1 s) when timed and timed again
("over once" counts those fast the second time: pauses of a shared host). The table gives,
per verifier: calls, crashes, time-outs, over once, and the max and p99 call time. A call that
stalls for `--stall` seconds (30 s) dumps every thread's stack and exits (faulthandler), so a
hang is reported, not waited out. Exit status 1 if any verifier crashed or timed out.

The responses mix answer-shaped text (numbers, \\boxed{}, "#### n", <think> blocks,
countdown expressions) with pathological input: nested and unbalanced LaTeX (\\frac, \\sqrt,
\\left), towers of exponents (10^{10^{10}}, 9**9**9**9), 10k-digit numbers, deep brackets,
unicode (fullwidth and Arabic-Indic digits, RTL and zero-width marks, combining characters,
lone surrogates), NUL bytes, empty and whitespace-only strings and 100 kB strings.
`fuzz_cases(n, seed)` is deterministic; tests/rewards/test_verifier_fuzz.py runs it small.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from reinforge.rewards.registry import BUILTIN_REWARDS  # noqa: E402

VERIFIERS = ("math_verify", "exact_match", "format", "countdown", "arithmetic")

_UNICODE = [
    "\uff14\uff12",  # fullwidth "42"
    "\u0664\u0662",  # Arabic-Indic "42"
    "\u200f42\u200e", "\u202e24\u202c",  # RTL / LTR marks and overrides
    "4\u200b2", "\ufeff42",  # zero-width space, BOM
    "4\u03022\u0301\u0301\u0301",  # combining marks
    "\ud800", "\udfff42\ud83d",  # lone surrogates (a str can hold them; UTF-8 cannot)
    "\u00b2\u00b3\u2074", "\u2153\u00bd", "\u221e", "\u2212 5", "\U0001d7d2\U0001d7d0",  # superscripts, fractions, math digits
    "\x00", "4\x002", "\x00" * 100,
]


def _number(rng: random.Random) -> str:
    kind = rng.randrange(7)
    if kind == 0:
        return str(rng.randint(-10**6, 10**6))
    if kind == 1:
        return f"{rng.uniform(-1e3, 1e3):.{rng.randrange(8)}f}"
    if kind == 2:
        return f"\\frac{{{rng.randint(-99, 99)}}}{{{rng.randint(0, 99)}}}"
    if kind == 3:
        return "".join(rng.choice("0123456789") for _ in range(rng.choice([300, 4301, 10_000])))
    if kind == 4:
        return rng.choice(["1e999999", "-0", "0.000", "1,000,000", "3.14e-300", "nan", "inf", "-inf", "1/0",
                           "0/0", "1.5e+308", "0x1F", "1_000"])
    if kind == 5:
        return rng.choice(_UNICODE)
    return str(rng.randint(0, 200))


def _nest(rng: random.Random, depth: int) -> str:
    """Nested LaTeX: \\frac in \\frac, \\sqrt in \\sqrt, exponent towers, \\left( ... \\right)."""
    kind = rng.randrange(5)
    if kind == 0:
        return "\\frac{" * depth + "1" + "}{2}" * depth
    if kind == 1:
        return "\\sqrt{" * depth + "2" + "}" * depth
    if kind == 2:
        return "{10^" * depth + "{10}" + "}" * depth
    if kind == 3:
        return "\\left(" * depth + "x" + "\\right)" * depth
    return "(" * depth + "1" + ")" * depth


def _pathological(rng: random.Random) -> str:
    kind = rng.randrange(16)
    if kind == 0:
        return _nest(rng, rng.choice([3, 20, 100, 1000, 5000]))
    if kind == 1:  # unbalanced
        return rng.choice(["\\boxed{", "\\frac{1}{", "\\sqrt{{{", "}}}{{{", "\\left(", "\\right)", "$$", "\\"]) * \
            rng.choice([1, 10, 1000])
    if kind == 2:
        return rng.choice(["10^{10^{10}}", "9**9**9**9", "9^{9^{9^{9}}}", "2^{2^{2^{2^{2^{2}}}}}", "10^{10^{100}}",
                           "10!!!!!", "(10^{100})!", "\\binom{10^{9}}{10^{5}}", "e^{e^{e^{e^{10}}}}", "9**999999",
                           "2**2**2**2**2**2", "1e10**1e10", "\\sum_{n=1}^{10^{12}} n", "\\int_0^\\infty e^{-x^2} dx",
                           "\\lim_{x\\to 0} \\frac{\\sin x}{x}", "x^{2}+y^{2}=z^{2}", "\\infty^{\\infty}",
                           "\\frac{d}{dx}x^{10^{10}}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}^{99999}"])
    if kind == 3:
        return "\\boxed{" + rng.choice(["10^{10^{10}}", "9**9**9**9", "9^{9^{9^{9}}}", "10^{10^{100}}",
                                        "(10^{100})!", "\\infty", "x^{2^{100}}", "10^{-10^{10}}"]) + "}"
    if kind == 4:
        return "\\boxed{" + "".join(rng.choice("0123456789") for _ in range(rng.choice([4301, 10_000]))) + "}"
    if kind == 5:
        return rng.choice(["(", "[", "{", "\\{"]) * rng.choice([100, 10_000]) + "1"
    if kind == 6:
        return rng.choice(_UNICODE) * rng.choice([1, 10, 1000])
    if kind == 7:
        return rng.choice(["", " ", "\n", "\t \r\n", " " * 100_000, "\x00", "\u3000\u2003"])
    if kind == 8:  # 100 kB strings of one kind
        unit = rng.choice(["9", "1+", "\\frac{", "x", "<think>", "####", "\\boxed{1}", "a b ", "()", "$", "\\\\", "^{"])
        return unit * (100_000 // len(unit))
    if kind == 9:  # 100 kB of random printable text with an answer at the end
        return "".join(rng.choice("ab cd+-*/^{}()\\=0123456789\n") for _ in range(100_000)) + " \\boxed{42}"
    if kind == 10:
        return "#### " + rng.choice(["", "\\frac{", "9" * 10_000, "1e999999", "\x00", "####", "42 #### 43"])
    if kind == 11:
        return "<think>" * rng.choice([1, 1000]) + rng.choice(["", "x", "</think>"]) + "</think>" * rng.choice([0, 1, 1000])
    if kind == 12:  # countdown-like expressions, valid and not
        return rng.choice(["(3+5)*2", "9**9**9**9", "2**999999", "1/0", "(" * 30 + "1" + ")" * 30, "1" * 64,
                           "__import__('os')", "3+5*2)", "((3+5)*2", "-(-(-(-1)))", "9" * 63 + "*9", "1/3*3",
                           "0/0", "1e9", "3 5 2", "", " " * 64, "+" * 64])
    if kind == 13:
        return "\\boxed{" * rng.choice([2, 50, 5000]) + "1" + "}" * rng.choice([0, 2, 5000])
    if kind == 14:
        return "".join(chr(rng.randrange(0x110000)) for _ in range(rng.choice([1, 10, 100, 2000])))
    return "\\text{" + "\\mathrm{" * 200 + "ok" + "}" * 200


def _answer_shaped(rng: random.Random) -> str:
    num = _number(rng)
    kind = rng.randrange(7)
    if kind == 0:
        return num
    if kind == 1:
        return f"The answer is \\boxed{{{num}}}."
    if kind == 2:
        return f"Adding up, we get {num}.\n#### {num}"
    if kind == 3:
        return f"<think>{_number(rng)} and {_number(rng)}</think> {num}"
    if kind == 4:
        return f"$${num}$$ so \\boxed{{{num}}} or maybe \\boxed{{{_number(rng)}}}"
    if kind == 5:
        nums = [str(rng.randint(1, 99)) for _ in range(rng.randint(2, 6))]
        return "".join(x + rng.choice("+-*/") for x in nums)[:-1]
    return f"{num} {_pathological(rng)} {num}"


def fuzz_response(rng: random.Random) -> str:
    return _answer_shaped(rng) if rng.random() < 0.5 else _pathological(rng)


def fuzz_ground_truth(rng: random.Random, verifier: str):
    """A ground truth a dataset could hold for `verifier` (countdown: its {numbers, target} schema)."""
    if verifier == "countdown":
        numbers = [rng.choice([rng.randint(1, 99), rng.randint(-10**6, 10**6), 0, 2**63 - 1])
                   for _ in range(rng.randint(0, 8))]
        target = rng.choice([rng.randint(1, 100), -5, 0, 2**63 - 1, -(2**63)])
        gt = {"numbers": numbers, "target": target}
        return json.dumps(gt) if rng.random() < 0.5 else gt
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randint(-10**6, 10**6)  # an int column
    if kind == 1:
        return rng.choice([0.5, -0.0, 1e300, float("nan"), float("inf"), 2**63 - 1, None, True])
    if kind == 2:
        return "\\boxed{" + _number(rng) + "}"
    if kind == 3:
        return _pathological(rng)
    return _number(rng)


def fuzz_cases(n: int, seed: int, verifier: str) -> list[tuple[str, object]]:
    """`n` (response, ground truth) pairs for `verifier`, the same for the same seed."""
    rng = random.Random(f"verifier-fuzz:{verifier}:{seed}")
    return [(fuzz_response(rng), fuzz_ground_truth(rng, verifier)) for _ in range(n)]


def _timed_call(fn, response, gt, stall_s: float | None) -> tuple[float, str | None]:
    """(seconds, crash description or None) for one call."""
    if stall_s:
        faulthandler.dump_traceback_later(stall_s, exit=True)
    crash = None
    start = time.perf_counter()
    try:
        score = fn("prompt", response, gt)
        if score not in (0.0, 1.0):
            raise AssertionError(f"score {score!r} is not 0 or 1")
    except Exception as exc:  # noqa: BLE001 - counting crashes is the point
        crash = f"{type(exc).__name__}: {str(exc)[:120]} on {response[:60]!r} / {str(gt)[:40]!r}"
    elapsed = time.perf_counter() - start
    if stall_s:
        faulthandler.cancel_dump_traceback_later()
    return elapsed, crash


def run_verifier(name: str, cases, budget_s: float, stall_s: float | None = None) -> dict:
    """Score every case; -> {calls, crashes, timeouts, slow_once, max_s, p99_s, first_crash, slow}.

    A score other than 0 or 1 counts as a crash. A call over `budget_s` is timed again: it is a
    time-out when both runs are over, else `slow_once` (the host is shared; a one-off pause is
    not the verifier's). max_s, p99_s and `slow` (the five slowest as (seconds, description))
    use the first timings. With `stall_s`, a call that long dumps every stack and ends the process.
    """
    fn = BUILTIN_REWARDS[name]
    fn("prompt", "1", '{"numbers": [1], "target": 1}')  # a process's first call pays one-off imports
    times, crashes, timeouts, slow_once, first_crash, slow = [], 0, 0, 0, None, []
    for response, gt in cases:
        elapsed, crash = _timed_call(fn, response, gt, stall_s)
        crashes += crash is not None
        first_crash = first_crash or crash
        if elapsed > budget_s:
            again = _timed_call(fn, response, gt, stall_s)[0]
            timeouts, slow_once = timeouts + (again > budget_s), slow_once + (again <= budget_s)
        times.append(elapsed)
        if len(slow) < 5 or elapsed > slow[-1][0]:
            slow = sorted(slow + [(elapsed, f"{response[:60]!r} ({len(response)} chars) / {str(gt)[:40]!r}")],
                          key=lambda x: -x[0])[:5]
    times.sort()
    return {"calls": len(times), "crashes": crashes, "timeouts": timeouts, "slow_once": slow_once,
            "max_s": times[-1] if times else 0.0, "p99_s": times[int(0.99 * (len(times) - 1))] if times else 0.0,
            "first_crash": first_crash, "slow": slow}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10_000, help="responses per verifier")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=float, default=1.0, help="a call slower than this (s) twice is a time-out")
    ap.add_argument("--stall", type=float, default=30.0, help="a call this slow (s) aborts the run with stacks")
    ap.add_argument("--only", nargs="*", default=list(VERIFIERS), choices=VERIFIERS)
    args = ap.parse_args(argv)
    rows = []
    for name in args.only:
        start = time.perf_counter()
        r = run_verifier(name, fuzz_cases(args.n, args.seed, name), args.budget, args.stall)
        r["total_s"] = time.perf_counter() - start
        rows.append((name, r))
    print(f"{args.n} fuzzed responses per verifier, seed {args.seed}; time-out: a call over {args.budget:g} s "
          "twice (over once: a host pause)")
    print()
    print("| verifier | calls | crashes | time-outs | over once | max ms | p99 ms | total s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['calls']} | {r['crashes']} | {r['timeouts']} | {r['slow_once']} | "
              f"{1000 * r['max_s']:.1f} | {1000 * r['p99_s']:.2f} | {r['total_s']:.1f} |")
    print()
    for name, r in rows:
        print(f"{name}: slowest calls:")
        for seconds, case in r["slow"]:
            print(f"  {1000 * seconds:.1f} ms on {case}")
        if r["first_crash"]:
            print(f"{name}: first crash: {r['first_crash']}")
    return 1 if any(r["crashes"] or r["timeouts"] for _, r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
