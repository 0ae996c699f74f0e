"""`code_tests`: run the response's code against the row's unit tests in the sandbox
(reinforge.sandbox: time, memory and output limits, no network, its own temp dir).

Ground truth, in veRL's code-dataset schema (PRIME / APPS / TACO rows, as veRL's
`prime_code` scorer reads them), as a dict or its JSON text:
- `{"inputs": [...], "outputs": [...]}`: standard input -> standard output. Each input is fed
  to the program as stdin; its output must equal the expected text token by token (whitespace
  and line breaks between tokens do not matter).
- `{"fn_name": "f", "inputs": [[args], ...], "outputs": [value, ...]}`: call-based. `f(*args)`
  (or `Solution().f(*args)`, LeetCode style) must return the value, compared after a JSON round
  trip (tuples equal lists); an expected value wrapped in a one-element list also matches.
Also accepted: a list of assert statements (MBPP / HumanEval style `test_list`), each a case.

The code is the last ```python fenced block of the response (else the last ``` block, else the
whole response). Score: {"score": 1.0 if every case passes else 0.0, "pass_rate": fraction}.
Every case has a CASE_TIMEOUT_S alarm and the run a TOTAL_TIMEOUT_S wall limit. This guards a
training run against mistakes, not against a policy that attacks the grader (the test data sit
in the harness's memory while the code runs).
"""
from __future__ import annotations

import json
import re
import secrets

from reinforge.sandbox import run_python

CASE_TIMEOUT_S = 2.0
TOTAL_TIMEOUT_S = 10.0
MEMORY_MB = 512
_FENCED = re.compile(r"```(python|py)?[^\n]*\n(.*?)```", re.DOTALL)

# The sandbox's main.py: reads and deletes the tests, runs each case with its stdout captured,
# prints one JSON line of per-case booleans after a marker the code cannot know in advance.
_HARNESS = r'''
import contextlib, io, json, os, signal, sys
spec = json.load(open("tests.json")); os.remove("tests.json")
src = open("solution.py").read(); os.remove("solution.py")
marker, real_stdout = spec.pop("marker"), sys.stdout
class CaseTimeout(BaseException): pass
def _alarm(signum, frame): raise CaseTimeout()
signal.signal(signal.SIGALRM, _alarm)
def run(fn):
    out = io.StringIO()
    signal.setitimer(signal.ITIMER_REAL, spec["case_timeout_s"])
    try:
        with contextlib.redirect_stdout(out):
            value = fn()
        return True, value, out.getvalue()
    except SystemExit as exc:  # exit() after printing the answer is a normal end
        return exc.code in (None, 0), None, out.getvalue()
    except BaseException:
        return False, None, out.getvalue()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
def fresh():
    return {"__name__": "__main__"}
def normal(v):
    return json.loads(json.dumps(v, default=str))
results = []
code = compile(src, "solution.py", "exec")
if spec["mode"] == "asserts":
    for test in spec["asserts"]:
        g = fresh()
        results.append(run(lambda: exec(code, g) or exec(test, g))[0])
elif spec["mode"] == "stdio":
    for inp, want in zip(spec["inputs"], spec["outputs"]):
        g = fresh()
        text = inp if isinstance(inp, str) else "\n".join(map(str, inp))
        sys.stdin = io.TextIOWrapper(io.BytesIO(text.encode()))  # has .buffer, as the real stdin
        ok, _, got = run(lambda: exec(code, g))
        want = want if isinstance(want, str) else "\n".join(map(str, want))
        results.append(ok and got.split() == want.split())
else:
    g = fresh()
    loaded = run(lambda: exec(code, g))[0]
    name = spec["fn_name"]
    for args, want in zip(spec["inputs"], spec["outputs"]):
        fn = g.get(name) or (getattr(g["Solution"](), name, None) if "Solution" in g else None)
        if not loaded or not callable(fn):
            results.append(False)
            continue
        ok, value, _ = run(lambda: fn(*args) if isinstance(args, list) else fn(args))
        try:
            got = normal(value)
        except Exception:
            ok = False
        results.append(ok and (got == normal(want) or [got] == normal(want)))
real_stdout.write(marker + json.dumps(results) + "\n")
'''


def extract_code(response: str) -> str:
    """The last ```python block of `response`, else its last ``` block, else the whole text."""
    blocks = _FENCED.findall(response)
    python = [code for lang, code in blocks if lang]
    if python or blocks:
        return (python or [code for _, code in blocks])[-1]
    return response


def parse_tests(ground_truth) -> dict:
    """The tests as {"mode": "stdio" | "call" | "asserts", ...}; ValueError when the ground
    truth is in none of the accepted shapes (the module doc)."""
    tests = ground_truth
    if isinstance(tests, str):
        tests = json.loads(tests)
    if isinstance(tests, (list, tuple)) and all(isinstance(t, str) for t in tests):
        return {"mode": "asserts", "asserts": list(tests)}
    if not isinstance(tests, dict) or "inputs" not in tests or "outputs" not in tests:
        raise ValueError("code_tests: ground truth must be {'inputs': [...], 'outputs': [...]} (optionally with "
                         "'fn_name') or a list of assert statements")
    inputs, outputs = list(tests["inputs"]), list(tests["outputs"])
    if len(inputs) != len(outputs) or not inputs:
        raise ValueError(f"code_tests: {len(inputs)} inputs and {len(outputs)} outputs; need as many of each, >= 1")
    if tests.get("fn_name"):
        return {"mode": "call", "fn_name": str(tests["fn_name"]), "inputs": inputs, "outputs": outputs}
    return {"mode": "stdio", "inputs": inputs, "outputs": outputs}


def code_tests(prompt: str, response: str, ground_truth, **extra) -> dict:
    """Run the response's code against the row's tests; {"score": all passed, "pass_rate"}."""
    tests = parse_tests(ground_truth)
    marker = f"@@results-{secrets.token_hex(8)}@@"
    files = {"solution.py": extract_code(response),
             "tests.json": json.dumps({**tests, "case_timeout_s": CASE_TIMEOUT_S, "marker": marker})}
    done = run_python(_HARNESS, files=files, timeout_s=TOTAL_TIMEOUT_S, memory_mb=MEMORY_MB, max_output_chars=100_000)
    line = next((ln for ln in reversed(done.stdout.splitlines()) if ln.startswith(marker)), None)
    n = len(tests["asserts"] if tests["mode"] == "asserts" else tests["inputs"])
    passed = json.loads(line[len(marker):]) if line is not None else [False] * n
    rate = sum(map(bool, passed)) / n
    return {"score": 1.0 if rate == 1.0 else 0.0, "pass_rate": rate}


code_tests.bounded = True  # the sandbox's wall limit bounds every call
