"""TRL reward functions, unchanged from a GRPOTrainer script: one call per batch, completions as
strings (plain prompts) or [{"role": "assistant", "content": ...}] (chat prompts), every dataset
column as a keyword argument, None for a sample a function does not apply to.

    reinforge train ... 'reward.functions=[{name: examples/reward_trl.py:accuracy_reward},
                                           {name: examples/reward_trl.py:brevity_reward, weight: 0.1}]'
"""


def _text(completion) -> str:
    return completion[0]["content"] if isinstance(completion, list) else completion


def accuracy_reward(completions, ground_truth, **kwargs):
    """1.0 for the exact answer; None for a row without a ground truth (left out of the sum)."""
    return [None if gt is None else float(_text(c).strip() == str(gt).strip())
            for c, gt in zip(completions, ground_truth)]


def brevity_reward(completions, completion_ids, **kwargs):
    """-1 per 10 tokens: a small push towards short answers (give it a small weight)."""
    return [-len(ids) / 10 for ids in completion_ids]
