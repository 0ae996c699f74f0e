"""`calculator`: "123*45=" -> "5535", with the `calculator` tool (issue 13's first agent task).

A 3-digit by 2-digit product is beyond what a ~3M-parameter model learns to compute in
minutes, but copying the operands into a call and the result out of the tool's answer is
easy. RL rows carry `tools: ["calculator"]`. An SFT row demonstrates the tool path in the tag
format, as the agent loop plays it: the prompt, the call, the result as a `tool` message
(context: no loss), then the product and EOS:

    123*45=<calculator>123*45</calculator><r>5535</r>5535<eos>
           ^^^^^^^^^^^ trained ^^^^^^^^^^^^ ^^ not ^^ ^trained^

`Example.answer` is the plain product (what a model without tools would have to write).
"""
from __future__ import annotations

import random
import re

from reinforge.tasks.base import Example, Task
from reinforge.tasks.tags import format_tag_call, format_tag_result

TOOL = "calculator"
# The final answer follows the last tool result (or the last call, if the text reaching the
# scorer holds no results); with no call at all, the whole response is the answer.
_LAST_TAG = re.compile(r"</(?:r|calculator)>")


def final_answer(response: str) -> str:
    """The text after the last `</r>` or `</calculator>` of a response, stripped."""
    return _LAST_TAG.split(response)[-1].strip()


def score_calculator(prompt: str, response: str, ground_truth, **extra) -> float:
    """1.0 when the final answer (final_answer) is the product; the tool's result itself does
    not count, only what the policy wrote after it."""
    return 1.0 if isinstance(response, str) and final_answer(response) == str(ground_truth).strip() else 0.0


score_calculator.bounded = True  # one regex split, linear in the response


def _sample(rng: random.Random) -> Example:
    a, b = rng.randint(100, 999), rng.randint(10, 99)
    product = a * b
    wrong = product + rng.choice([1, -1, 10, -10, 100, -100])
    return Example(prompt=f"{a}*{b}=", answer=str(product), ground_truth=str(product), wrong=str(wrong))


def tool_demonstration(example: Example) -> dict:
    """SFT columns for `example`: a TRL conversational prompt/completion whose rendering with the
    character tokenizer's template is exactly the loop's sequence (module doc); the tool
    message is context, each assistant message a target."""
    expression = example.prompt.rstrip("=")
    return {
        "prompt": [{"role": "user", "content": example.prompt}],
        "completion": [
            {"role": "assistant", "content": format_tag_call(TOOL, expression)},
            {"role": "tool", "content": format_tag_result(example.ground_truth)},
            {"role": "assistant", "content": example.answer},
        ],
    }


def make_calculator() -> Task:
    """3-digit x 2-digit multiplication with the calculator tool (81,000 distinct prompts)."""
    return Task(name="calculator", ability="tool_use", sample=_sample, score=score_calculator, options={},
                size=900 * 90, row_columns={"tools": [TOOL]}, sft_row=tool_demonstration)
