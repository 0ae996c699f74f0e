"""Validation: greedy accuracy, and (when asked) sampled mean@n, best@n and unbiased pass@k on
held-out prompts, plus a sample of prompts, responses and rewards written to samples/step_N.jsonl.

Metric names follow veRL's (`val-core/<data_source>/acc/mean@N`, ...; see `verl_names`), and the
short names the console, demo, studies and report read stay as aliases (`val/acc_greedy`,
`val/acc_sampled`, `val/pass@k`, ...).

It runs under `torch.random.fork_rng`, so validating never shifts the training random stream:
a run validated at different steps still trains bit-identically.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

import torch

from reinforge.protocol import Batch
from reinforge.trainers.logging import write_jsonl
from reinforge.trainers.metrics import episode_row, pass_at_k


def prompts_batch(items: list[dict], first_uid: int) -> Batch:
    """Dataset items -> the prompt Batch the rollout expects (uid = group id). Image prompts
    (items with "vision", data/rl_dataset.py) add `vision`: one PromptImages or None per prompt,
    the item's own object (so the frozen tower's features cached on it are reused); a text-only
    batch has no `vision` key, as before."""
    non_tensors = {"prompt_ids": [it["prompt_ids"] for it in items], "prompt_text": [it["prompt_text"] for it in items],
                   "ground_truth": [it["ground_truth"] for it in items],
                   "data_source": [it.get("data_source", "unknown") for it in items],
                   "extra": [it.get("extra", {}) for it in items]}
    if all("prompt_raw" in it for it in items):  # the prompt column as the file holds it (rollout.agent's row)
        non_tensors["prompt_raw"] = [it["prompt_raw"] for it in items]
    if any(it.get("vision") is not None for it in items):
        non_tensors["vision"] = [it.get("vision") for it in items]
    return Batch({"uid": torch.arange(first_uid, first_uid + len(items), dtype=torch.long)}, non_tensors)


def _generate_and_score(rollout, reward, prompts: Batch, n: int, temperature: float, greedy: bool, batch_size: int,
                        progress: Callable[[int], None]):
    outs = []
    for part in prompts.split(batch_size):
        b = rollout.generate(part, n=n, temperature=temperature, greedy=greedy)
        if len(b) > len(part) * n:  # rollout.agent_history=split: a run's extra sequences follow its B0 * n rows
            b = b.index(list(range(len(part) * n)))
        outs.append(b | reward.score(b).batch())
        progress(len(b))
    return Batch.concat(outs)


def _mean(xs) -> float:
    return sum(xs) / len(xs)


def verl_names(src: str, greedy_acc: list[float], greedy_score: list[float], sampled_acc: list[list[float]] | None,
               sampled_score: list[list[float]] | None, pass_k: list[int]) -> dict[str, float]:
    """veRL's validation names for one data source, each a mean over its prompts.

    greedy_*: (P,) per prompt; sampled_*: (P, N) per prompt and sample, or None.
    `acc` (correctness) is the core variable, `reward` (the sequence score) an auxiliary one:
      val-core/<src>/acc/mean@1                   greedy (veRL's name for n=1 validation)
      val-core/<src>/acc/mean@N, best@N/mean, worst@N/mean, pass@k (k <= N)   sampled, N >= 2
      val-aux/<src>/acc/std@N                     the per-prompt std over the N samples
      val-aux/<src>/reward/mean@1, mean@N, ...    the same for the score (no pass@k)
    best@N is the exact maximum of the N samples, where veRL bootstraps it. With N = 1 a sampled
    mean@1 would collide with the greedy one, so it is only in the alias val/acc_sampled."""
    out: dict[str, float] = {}
    for var, section, greedy, sampled in (("acc", "val-core", greedy_acc, sampled_acc),
                                          ("reward", "val-aux", greedy_score, sampled_score)):
        pre = f"{section}/{src}/{var}"
        out[f"{pre}/mean@1"] = _mean(greedy)
        if sampled is None or len(sampled[0]) < 2:
            continue
        n = len(sampled[0])
        out[f"{pre}/mean@{n}"] = _mean([_mean(r) for r in sampled])
        out[f"val-aux/{src}/{var}/std@{n}"] = _mean([statistics.pstdev(r) for r in sampled])
        out[f"{pre}/best@{n}/mean"] = _mean([max(r) for r in sampled])
        out[f"{pre}/worst@{n}/mean"] = _mean([min(r) for r in sampled])
        if var == "acc":
            for k in (k for k in pass_k if k <= n):
                out[f"{pre}/pass@{k}"] = _mean([pass_at_k(n, round(sum(r)), k) for r in sampled])
    return out


def validate(rollout, reward, items: list[dict], *, n: int, temperature: float, pass_k: list[int],
             batch_size: int, sampled: bool = True, samples_path: Path | None = None, max_samples_saved: int = 32,
             progress: Callable[[int], None] | None = None, policy_version: int | None = None) -> dict[str, float]:
    """Greedy decoding always; with `sampled`, n samples per prompt at `temperature` too.

    Metrics: veRL's names (verl_names) per data source, and the aliases `val/acc_greedy`,
    `val/score_greedy`, `val/response_length_greedy`, `val/<data_source>/acc_greedy` and, when
    sampled, `val/acc_sampled`, `val/pass@k`, `val/<data_source>/acc_sampled` (over all sources).
    `progress(k)` is called as each generation call finishes k sequences; the whole validation
    is `validation_size(len(items), n, sampled)` sequences. `policy_version`: the version of the
    weights validated (the trainer's completed steps), passed to the rollout in the prompts' meta."""
    if not items:
        return {}
    progress = progress or (lambda k: None)
    prompts = prompts_batch(items, 0)
    if policy_version is not None:
        prompts.meta["policy_version"] = policy_version
    with torch.random.fork_rng():
        greedy = _generate_and_score(rollout, reward, prompts, 1, 1.0, True, batch_size, progress)
        samp = _generate_and_score(rollout, reward, prompts, n, temperature, False, batch_size, progress) if sampled else None
    by_source = defaultdict(list)
    for i, src in enumerate(greedy["data_source"]):
        by_source[src].append(i)
    g_acc, g_score = greedy["acc"], greedy["seq_scores"]
    s_acc = samp["acc"].view(len(items), n) if sampled else None
    s_score = samp["seq_scores"].view(len(items), n) if sampled else None
    metrics: dict[str, float] = {}
    for src, idx in sorted(by_source.items()):
        metrics.update(verl_names(src, g_acc[idx].tolist(), g_score[idx].tolist(),
                                  s_acc[idx].tolist() if sampled else None,
                                  s_score[idx].tolist() if sampled else None, pass_k))
        metrics[f"val/{src}/acc_greedy"] = float(g_acc[idx].mean())
        if sampled:
            metrics[f"val/{src}/acc_sampled"] = float(s_acc[idx].mean())
    metrics["val/acc_greedy"] = float(g_acc.mean())
    metrics["val/score_greedy"] = float(g_score.mean())
    metrics["val/response_length_greedy"] = float(greedy["response_mask"].sum(-1).float().mean())
    if "trajectory" in greedy:  # multi-turn episodes: turns, tool calls, ... of the greedy ones
        from reinforge.agents.loop import episode_metrics

        metrics.update(episode_metrics(greedy["trajectory"], "val/agent/"))
    if sampled:
        metrics["val/acc_sampled"] = float(s_acc.mean())
        correct = s_acc.sum(-1).long().tolist()
        for k in pass_k:
            if k <= n:
                metrics[f"val/pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct) / len(correct)
    if samples_path is not None:
        write_jsonl(samples_path, [{"prompt": greedy["prompt_text"][i], "response": greedy["response_text"][i],
                                    "ground_truth": str(greedy["ground_truth"][i]), "score": float(g_score[i]),
                                    "acc": float(g_acc[i]),
                                    **(episode_row(greedy["trajectory"][i]) if "trajectory" in greedy else {})}
                                   for i in range(min(max_samples_saved, len(items)))])
    return metrics


def validation_size(prompts: int, n: int, sampled: bool) -> int:
    """Sequences one validation generates: a greedy answer per prompt, plus n samples when sampled."""
    return prompts * (1 + n * sampled)


def val_progress(logger, prompts: int, n: int, sampled: bool):
    """`logger.val_progress` (trainers.logging.RunLogger) for one validation of `prompts` prompts;
    a no-op yielding None without a logger. Yields the progress callback `validate` takes."""
    if logger is None:
        return nullcontext(None)
    what = f"{prompts} prompts x (1 greedy{f' + {n} sampled' if sampled else ''})"
    return logger.val_progress(validation_size(prompts, n, sampled), what)


class PromptEvaluator:
    """Greedy accuracy, sampled mean@n and pass@k of a model on RL-schema prompt files (the RL
    trainer's validation), for SFT, DPO and `reinforge eval`. The prompts are tokenised once;
    generation runs on the model as it is at each call.

    `e` is an eval section (reinforge.config.common.GenEvalConfig or SFTEvalConfig); `backend`
    a rollout.backend name (workers/rollout/__init__.py), the lean loop unless given, and
    `engine_kw` what an own_weights backend needs besides (build_rollout). `processor`: a
    vision-language model's, which reads the prompts (image prompts keep their images); the
    rollout and the rewards take `tokenizer`, its text tokenizer."""

    def __init__(self, model, tokenizer, e, *, device: str = "cpu", pass_k=(), backend: str = "lean", processor=None,
                 **engine_kw):
        from reinforge.config.schema import RolloutConfig
        from reinforge.data import RLDataset
        from reinforge.workers.rollout import build_rollout

        self.e, self.tok, self.device = e, tokenizer, device
        self.pass_k = [k for k in pass_k if k <= e.n]
        items = [it for f in e.prompt_files
                 for it in RLDataset(f, processor or tokenizer, max_prompt_length=e.max_prompt_length, length_key="eval.max_prompt_length")]
        self.items = items[:e.max_samples]
        r = RolloutConfig(backend=backend, max_response_length=e.max_response_length, micro_batch_size=e.batch_size)
        self.rollout = build_rollout(backend, model, tokenizer, r, max_prompt_length=e.max_prompt_length, **engine_kw)
        self.reward = self._reward_worker()

    def _reward_worker(self):
        from reinforge.config.schema import AlgorithmConfig, RewardConfig
        from reinforge.workers.reward import RewardWorker

        return RewardWorker(self.tok, RewardConfig(functions=list(self.e.reward_functions)), AlgorithmConfig(),
                            max_response_length=self.e.max_response_length, device=self.device)

    def __call__(self, samples_path: Path | None = None, *, sampled: bool = True, logger=None) -> dict[str, float]:
        """Greedy (and with `sampled`, sampled) metrics; progress shown on `logger` if given."""
        if self.reward is None:  # used again after close()
            self.reward = self._reward_worker()
        with val_progress(logger, len(self.items), self.e.n, sampled) as progress:
            return validate(self.rollout, self.reward, self.items, n=self.e.n, temperature=self.e.temperature,
                            pass_k=self.pass_k, batch_size=self.e.batch_size, sampled=sampled,
                            samples_path=samples_path, progress=progress)

    def close(self) -> None:
        if self.reward is not None:
            self.reward.close()
            self.reward = None
