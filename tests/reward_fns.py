"""Reward functions used by the end-to-end tests: a random tiny model almost never answers
arithmetic right, so these give graded rewards that make advantages (and updates) non-zero."""


def digit_fraction(prompt: str, response: str, ground_truth, **extra) -> dict:
    """Fraction of characters that are digits, and exact-match accuracy as a logged extra."""
    frac = sum(c.isdigit() for c in response) / max(len(response), 1)
    return {"score": frac, "exact": float(response.strip() == str(ground_truth).strip())}


def odd_first_char(prompt: str, response: str, ground_truth, **extra) -> float:
    """1 when the response starts with a character of odd code point: about half of an untrained
    model's samples, so a group's advantages are rarely all zero (an update that moves weights)."""
    return float(bool(response) and ord(response[0]) % 2 == 1)


def flat_on_odd_answers(prompt: str, response: str, ground_truth, **extra) -> float:
    """1 for every sample of a prompt whose answer is odd (a group with no variance: DAPO's dynamic
    sampling drops it), odd_first_char otherwise (mixed groups)."""
    return 1.0 if int(ground_truth) % 2 else odd_first_char(prompt, response, ground_truth)
