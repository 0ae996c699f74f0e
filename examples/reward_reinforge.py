"""A reward function in reinforge's own style: one sample a call, the prompt text, the response,
the ground truth and every other column of the row (`data_source` included) as keywords.

    reinforge train ... 'reward.functions=[{name: examples/reward_reinforge.py:digits_then_exact}]'
"""


def digits_then_exact(prompt, response, ground_truth, **extra):
    """Partial credit for an all-digit answer, full credit for the exact one; `exact` is logged
    as reward/digits_then_exact/exact."""
    answer = response.strip()
    exact = float(answer == str(ground_truth).strip())
    return {"score": max(exact, 0.2 * float(answer.isdigit())), "exact": exact}
