"""Validation: greedy mean@1, sampled mean@n and unbiased pass@k on held-out prompts, plus a
sample of prompts, responses and rewards written to samples/step_N.jsonl.

It runs under `torch.random.fork_rng`, so validating never shifts the training random stream:
a run validated at different steps still trains bit-identically.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch

from reinforge.protocol import Batch
from reinforge.trainers.metrics import pass_at_k


def prompts_batch(items: list[dict], first_uid: int) -> Batch:
    """Dataset items -> the prompt Batch the rollout expects (uid = group id)."""
    return Batch({"uid": torch.arange(first_uid, first_uid + len(items), dtype=torch.long)},
                 {"prompt_ids": [it["prompt_ids"] for it in items], "prompt_text": [it["prompt_text"] for it in items],
                  "ground_truth": [it["ground_truth"] for it in items],
                  "data_source": [it.get("data_source", "unknown") for it in items],
                  "extra": [it.get("extra", {}) for it in items]})


def _generate_and_score(rollout, reward, prompts: Batch, n: int, temperature: float, greedy: bool, batch_size: int):
    outs = []
    for part in prompts.split(batch_size):
        b = rollout.generate(part, n=n, temperature=temperature, greedy=greedy)
        scored, _ = reward.score(b)
        outs.append(b | scored)
    return Batch.concat(outs)


def validate(rollout, reward, items: list[dict], *, n: int, temperature: float, pass_k: list[int],
             batch_size: int, samples_path: Path | None = None, max_samples_saved: int = 32) -> dict[str, float]:
    """Metrics `val/<data_source>/...` and overall `val/acc_greedy`, `val/acc_sampled`, `val/pass@k`."""
    if not items:
        return {}
    prompts = prompts_batch(items, 0)
    with torch.random.fork_rng():
        greedy = _generate_and_score(rollout, reward, prompts, 1, 1.0, True, batch_size)
        sampled = _generate_and_score(rollout, reward, prompts, n, temperature, False, batch_size)
    metrics: dict[str, float] = {}
    by_source = defaultdict(list)
    for i, src in enumerate(greedy["data_source"]):
        by_source[src].append(i)
    g_acc = greedy["acc"]
    s_acc = sampled["acc"].view(len(items), n)
    for src, idx in sorted(by_source.items()):
        metrics[f"val/{src}/acc_greedy"] = float(g_acc[idx].mean())
        metrics[f"val/{src}/acc_sampled"] = float(s_acc[idx].mean())
    metrics["val/acc_greedy"] = float(g_acc.mean())
    metrics["val/acc_sampled"] = float(s_acc.mean())
    metrics["val/score_greedy"] = float(greedy["seq_scores"].mean())
    correct = s_acc.sum(-1).long().tolist()
    for k in pass_k:
        if k <= n:
            metrics[f"val/pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct) / len(correct)
    metrics["val/response_length_greedy"] = float(greedy["response_mask"].sum(-1).float().mean())
    if samples_path is not None:
        samples_path.parent.mkdir(parents=True, exist_ok=True)
        with open(samples_path, "w") as f:
            for i in range(min(max_samples_saved, len(items))):
                f.write(json.dumps({"prompt": greedy["prompt_text"][i], "response": greedy["response_text"][i],
                                    "ground_truth": str(greedy["ground_truth"][i]),
                                    "score": float(greedy["seq_scores"][i]), "acc": float(g_acc[i])}) + "\n")
    return metrics
