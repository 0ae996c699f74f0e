"""The calculator task as an ordinary OpenAI-client agent (rollout.agent=examples/calculator_agent.py:run).

Its own loop: ask the model, run each calculator call it makes, send the results back, and score
the final answer against the row's ground truth. Nothing here is reinforge's: point base_url at
any OpenAI-compatible server and it runs the same (docs/agents.md, "Bring your own agent").
"""
import json

import openai

CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses.",
    "parameters": {"type": "object", "required": ["expression"],
                   "properties": {"expression": {"type": "string", "description": "e.g. 123*45"}}}}}
CLIENT = openai.OpenAI(api_key="set-per-run", max_retries=0)  # one connection pool for every run


def calculate(expression: str) -> str:
    try:
        a, b = expression.split("*")
        return str(int(a) * int(b))
    except ValueError:
        return f"error: cannot evaluate {expression!r}"


def run(base_url: str, api_key: str, row: dict) -> float:
    client = CLIENT.with_options(base_url=base_url, api_key=api_key)
    prompt = row["prompt"]  # the dataset's prompt column: "123*45=" (or a list of messages)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    try:
        for _ in range(3):
            reply = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
            message = reply.choices[0].message
            messages.append(message)
            if not message.tool_calls:
                return float((message.content or "").strip() == str(row["ground_truth"]))
            for call in message.tool_calls:
                result = calculate(json.loads(call.function.arguments).get("expression", ""))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    except openai.BadRequestError:  # e.g. the episode's token budget is spent
        pass
    return 0.0
