"""TRL's half of benchmarks/vs_trl.py: GRPOTrainer steps on a model folder, timed per stage.

Runs inside TRL's own venv (`make trl-venv`), never imports reinforge, and prints one JSON line:
{"steps": [{"step": s, "gen": s, "reward": s, "ref": s, "update": s, "tokens": n}, ...]}
(every optimizer step, warm-up included; the caller drops the warm-up). `update` is the step
time left after generation, reward and the no-grad reference pass: the loss forward, backward
and the optimizer step, plus TRL's own bookkeeping.

Settings match reinforge's side: one generation of prompts x num_generations completions per
optimizer step (per-device batch = the whole generation, no accumulation, one iteration, so
TRL skips its old-log-prob pass as reinforge does), fp32 or TRL's default bf16 (`--bf16 1`),
gradient checkpointing on or off (`--gc`; TRL's default is on), the attention kernel given (`--attn`), sampling at temperature 1 from the full softmax (top_k=0, top_p=1) and EOS suppressed with
`min_new_tokens = max_completion_length`, so every completion is exactly that long.

For the real-model rows and benchmarks/vs_trl_learning.py: `--reward reasoning_gym` (rows of
`reinforge data reasoning-gym`; chat prompts, which TRL renders with the tokenizer's chat
template), `--ignore-eos 0` (stop at EOS), `--defaults 1` (GRPOConfig's own precision and
checkpointing instead of `--bf16` / `--gc`) and `--save DIR` (the trained model and tokenizer).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import defaultdict


def arithmetic_reward(completions, reward_model, **_):
    """1.0 when the completion starts with the ground-truth number (the built-in task's rule)."""
    out = []
    for text, rm in zip(completions, reward_model):
        m = re.match(r"\s*(-?\d+)", text)
        out.append(float(m is not None and m.group(1) == str(rm["ground_truth"])))
    return out


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_IS_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_SCORERS: dict = {}


def extract_answer(text: str, ground_truth) -> str | None:
    """reinforge's reasoning_gym extraction rule (rewards/reasoning_gym.py, restated here because
    this side never imports reinforge): the last <answer>...</answer>, else the last number when
    the truth is a number, else the stripped text; empty text is no answer."""
    if not text.strip():
        return None
    tags = _ANSWER_TAG.findall(text)
    if tags:
        return tags[-1].strip()
    if _IS_NUMBER.fullmatch(str(ground_truth).strip()):
        numbers = _NUMBER.findall(text)
        if numbers:
            return numbers[-1].replace(",", "")
    return text.strip()


def reasoning_gym_reward(completions, reward_model, extra_info, **_):
    """The task's own score_answer (rebuilt from the row's extra_info, once per task and options)
    on the extracted answer: reinforge's `reasoning_gym` reward, score in [0, 1]."""
    import reasoning_gym

    out = []
    for c, rm, info in zip(completions, reward_model, extra_info):
        text = c[-1]["content"] if isinstance(c, list) else c  # conversational prompts: message lists
        key = (info["rg_task"], info["rg_options"])
        if key not in _SCORERS:
            _SCORERS[key] = reasoning_gym.create_dataset(key[0], seed=0, size=1,
                                                         **json.loads(key[1])).score_answer
        try:
            out.append(float(_SCORERS[key](answer=extract_answer(text, rm["ground_truth"]),
                                           entry=json.loads(info["rg_entry"]))))
        except Exception:  # a scorer that cannot parse the answer: wrong, as on reinforge's side
            out.append(0.0)
    return out


REWARDS = {"arithmetic": arithmetic_reward, "reasoning_gym": reasoning_gym_reward}


def timed(obj, name: str, times: dict, key):
    """Wrap method `name` of `obj` so that its wall time is added to times[key()]."""
    fn = getattr(obj, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            times[key()] += time.perf_counter() - t0

    setattr(obj, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--train", required=True, help="reinforge task parquet (prompt, reward_model columns)")
    ap.add_argument("--steps", type=int, required=True, help="optimizer steps, warm-up included")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--beta", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bf16", type=int, default=0)
    ap.add_argument("--gc", type=int, default=0, help="gradient checkpointing (TRL's default: on)")
    ap.add_argument("--attn", default="sdpa")
    ap.add_argument("--reward", default="arithmetic", choices=list(REWARDS))
    ap.add_argument("--ignore-eos", type=int, default=1, help="min_new_tokens = max tokens (0: stop at EOS)")
    ap.add_argument("--save", default="", help="save the trained model and tokenizer to this folder")
    ap.add_argument("--defaults", type=int, default=0,
                    help="TRL's own precision and checkpointing (bf16 / gc flags not passed)")
    args = ap.parse_args()

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    data = Dataset.from_parquet(args.train)
    data = data.select_columns([c for c in ("prompt", "reward_model", "extra_info") if c in data.column_names])
    batch = args.prompts * args.n
    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_side_"), per_device_train_batch_size=batch,
        gradient_accumulation_steps=1, num_generations=args.n, max_completion_length=args.max_tokens,
        num_iterations=1, beta=args.beta, learning_rate=args.lr, max_steps=args.steps, temperature=1.0,
        top_k=0, top_p=1.0, generation_kwargs={"min_new_tokens": args.max_tokens} if args.ignore_eos else None,
        use_cpu=True, **({} if args.defaults else {"bf16": bool(args.bf16), "gradient_checkpointing": bool(args.gc)}),
        model_init_kwargs={"attn_implementation": args.attn},
        report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, seed=args.seed,
        dataloader_num_workers=0)
    trainer = GRPOTrainer(model=args.model, reward_funcs=REWARDS[args.reward], args=cfg, train_dataset=data)

    times: dict = defaultdict(float)
    stage = lambda: "ref" if not torch.is_grad_enabled() else "update_fwd"  # noqa: E731
    timed(trainer, "_generate_single_turn", times, lambda: "gen")
    timed(trainer, "_calculate_rewards", times, lambda: "reward")
    timed(trainer, "_get_per_token_logps_and_entropies", times, stage)
    steps, tokens = [], []
    orig_gen = trainer._generate_single_turn

    def count_tokens(*a, **kw):
        out = orig_gen(*a, **kw)
        tokens.append(sum(len(c) for c in out[0]))  # (completion_ids, logprobs), EOS cut off
        return out

    trainer._generate_single_turn = count_tokens

    class StepClock(TrainerCallback):
        def on_train_begin(self, *_, **__):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, *_, **__):
            now = time.perf_counter()
            total, t = now - self.t0, dict(times)
            rest = total - t.get("gen", 0) - t.get("reward", 0) - t.get("ref", 0)
            steps.append({"step": total, "gen": t.get("gen", 0.0), "reward": t.get("reward", 0.0),
                          "ref": t.get("ref", 0.0), "update": rest, "tokens": sum(tokens),
                          "cpu": time.process_time() - self.c0})
            times.clear()
            tokens.clear()
            self.t0, self.c0 = time.perf_counter(), time.process_time()

    trainer.add_callback(StepClock())
    trainer.train()
    if args.save:
        trainer.save_model(args.save)
        trainer.processing_class.save_pretrained(args.save)
    json.dump({"steps": steps, "threads": torch.get_num_threads(), "bf16": bool(cfg.bf16),
               "gradient_checkpointing": bool(cfg.gradient_checkpointing)}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
