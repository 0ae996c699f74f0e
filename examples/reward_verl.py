"""A veRL reward function, unchanged: veRL calls it through custom_reward_function.path/.name,
reinforge through reward.functions, with the same keyword arguments (the style is read from
the parameter names).

    reinforge train ... 'reward.functions=[{name: examples/reward_verl.py:compute_score}]'
"""
import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """1.0 when the last number in the response is the ground truth. The other numeric keys of
    the dict are logged as reward/compute_score/<key>; `pred`, a string, is not."""
    numbers = _NUMBER.findall(solution_str)
    pred = numbers[-1] if numbers else ""
    return {"score": float(pred == str(ground_truth).strip()), "has_number": float(bool(numbers)), "pred": pred}
