"""Preference data from a model's own samples: n responses per prompt, scored by a reward, become
DPO pairs (the best-scored response chosen, the worst rejected) and KTO's unpaired rows.

This is the on-policy route to preference data (the model sampled it, a scorer ranked it), as
opposed to hand-written pairs; `reinforge data pairs` (cli/pairs.py) samples and scores, this
module only ranks and writes, so it is tested on hand-made scores.
"""
from __future__ import annotations

from pathlib import Path


def rank_samples(prompts: list[str], responses: list[str], scores: list[float], n: int,
                 finished: list[bool] | None = None) -> tuple[list[dict], list[dict]]:
    """(pairs, unpaired) from `len(prompts)` groups of `n` consecutive samples each.

    prompts: (P,) the prompt text each group was sampled from; responses, scores, finished:
    (P * n,) in group order (sample j of prompt i at i * n + j). finished: whether the sample
    ended at a stop token (None: all did); an unfinished one is left out, since a trainer
    appends EOS to every response and would teach it to stop where it did not.

    pairs: one row {prompt, chosen, rejected, chosen_score, rejected_score} per group whose best
    and worst scores differ (the first sample with the highest score, the first with the lowest);
    a group whose samples all score the same carries no preference and gives none.
    unpaired: KTO rows {prompt, completion, label, score} for every distinct response of such a
    group: label True at the group's best score, False at its worst, middle scores left out.
    """
    if len(responses) != len(prompts) * n or len(scores) != len(responses):
        raise ValueError(f"{len(prompts)} prompts x n={n} need {len(prompts) * n} responses and scores, "
                         f"got {len(responses)} and {len(scores)}")
    finished = finished if finished is not None else [True] * len(responses)
    pairs, unpaired = [], []
    for i, prompt in enumerate(prompts):
        group = [(scores[k], responses[k]) for k in range(i * n, (i + 1) * n)
                 if finished[k] and responses[k].strip()]
        if len(group) < 2:
            continue
        hi, lo = max(s for s, _ in group), min(s for s, _ in group)
        if hi == lo:
            continue
        chosen = next(r for s, r in group if s == hi)
        rejected = next(r for s, r in group if s == lo)
        pairs.append({"prompt": prompt, "chosen": chosen, "rejected": rejected, "chosen_score": hi,
                      "rejected_score": lo})
        seen = set()
        for s, r in group:
            if s in (hi, lo) and r not in seen:
                seen.add(r)
                unpaired.append({"prompt": prompt, "completion": r, "label": s == hi, "score": s})
    return pairs, unpaired


def write_pairs(out: str | Path, pairs: list[dict], unpaired: list[dict]) -> dict[str, Path]:
    """prefs.parquet (DPO / RM: prompt, chosen, rejected + scores) and kto.parquet (prompt,
    completion, label + score) in `out`; returns their paths."""
    import pandas as pd

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"prefs": out / "prefs.parquet", "kto": out / "kto.parquet"}
    pd.DataFrame(pairs, columns=["prompt", "chosen", "rejected", "chosen_score", "rejected_score"]).to_parquet(
        paths["prefs"], index=False)
    pd.DataFrame(unpaired, columns=["prompt", "completion", "label", "score"]).to_parquet(paths["kto"], index=False)
    return paths
