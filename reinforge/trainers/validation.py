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


class PromptEvaluator:
    """Greedy accuracy, sampled mean@n and pass@k of a model on RL-schema prompt files (the RL
    trainer's validation), for SFT, DPO and `reinforge eval`. The prompts are tokenised once;
    generation runs on the model as it is at each call.

    `e` is an eval section (reinforge.config.common.GenEvalConfig or SFTEvalConfig)."""

    def __init__(self, model, tokenizer, e, *, device: str = "cpu", pass_k=()):
        from reinforge.data import RLDataset
        from reinforge.workers.rollout.hf import HFRollout

        self.e, self.tok, self.device = e, tokenizer, device
        self.pass_k = [k for k in pass_k if k <= e.n]
        items = [it for f in e.prompt_files for it in RLDataset(f, tokenizer, max_prompt_length=e.max_prompt_length)]
        self.items = items[:e.max_samples]
        self.rollout = HFRollout(model, tokenizer, max_prompt_length=e.max_prompt_length,
                                 max_response_length=e.max_response_length, micro_batch_size=e.batch_size)
        self.reward = self._reward_worker()

    def _reward_worker(self):
        from reinforge.config.schema import AlgorithmConfig, RewardConfig
        from reinforge.workers.reward import RewardWorker

        return RewardWorker(self.tok, RewardConfig(functions=list(self.e.reward_functions)), AlgorithmConfig(),
                            max_response_length=self.e.max_response_length, device=self.device)

    def __call__(self, samples_path: Path | None = None) -> dict[str, float]:
        if self.reward is None:  # used again after close()
            self.reward = self._reward_worker()
        return validate(self.rollout, self.reward, self.items, n=self.e.n, temperature=self.e.temperature,
                        pass_k=self.pass_k, batch_size=self.e.batch_size, samples_path=samples_path)

    def close(self) -> None:
        if self.reward is not None:
            self.reward.close()
            self.reward = None
