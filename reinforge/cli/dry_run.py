"""`reinforge train|sft|dpo|rm --dry-run`: every check a run makes before it trains, then a summary.

In the order a run makes them: the config's rules and each file it names (trainers/preflight.py:
ranges, model folders' config.json, safetensors headers and tokenizer files, reward functions
imported and their signatures checked, LoRA targets), the run directory's reuse rule and whether
it can be written, the tokenizer loaded, and the data read and tokenized with the length rules
(the trainers' own loading functions, so skips and errors are those of a run). No model weights
load and nothing is written: a run directory that does not exist is not created.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

from reinforge.config.load import ConfigError


def writable_run_dir(run_dir: str) -> str:
    """How a run would use `run_dir`, checked without creating it: "exists" or "will be created";
    ConfigError when it (or its nearest existing parent) is a file or cannot be written."""
    path = Path(run_dir).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(f"trainer.run_dir={run_dir!r} cannot be written ({existing} is a file, not a folder); "
                          "choose another trainer.run_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"trainer.run_dir={run_dir!r} cannot be written (no permission on {existing}); "
                          "choose another trainer.run_dir")
    return "exists" if existing == path else "will be created"


def count_parameters(folder: str) -> int | None:
    """Parameters of the model in `folder`, summed over its safetensors headers' shapes (tied
    weights are stored once, as `model.parameters()` counts them); None for .bin weights."""
    from reinforge.models.checks import weight_shapes

    shapes = weight_shapes(folder)
    return None if shapes is None else sum(math.prod(s) for s in shapes.values())


def _model_line(cfg) -> str:
    path = cfg.model.path
    config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    n = count_parameters(path)
    size = f"{n / 1e6:.2f}M parameters" if n is not None else "parameters unknown (.bin weights)"
    return (f"model.path={path} ({config.get('model_type', '?')}, {size}, "
            f"max_position_embeddings={config.get('max_position_embeddings', '?')}); weights not loaded")


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _skipped(n: int, limit: str) -> str:
    return f", {n} skipped (longer than {limit})" if n else ""


def _data_lines(command: str, plan, tok) -> list[str]:
    """Reads the data as the trainer of `command` does; one line per dataset."""
    cfg = plan.cfg
    d = cfg.data
    if command == "train":
        from reinforge.trainers.rl_setup import load_data

        train, val_items, skipped = load_data(plan, tok)
        lines = [f"data.train_files: {len(train)} prompts"
                 f"{_skipped(skipped, f'data.max_prompt_length={d.max_prompt_length}')}; "
                 f"{_steps(cfg.trainer.total_steps)} of {d.train_batch_size} prompts x {cfg.rollout.n} samples",
                 *_length_line(train, d.max_prompt_length)]
        if d.val_files:
            lines.append(f"data.val_files: {len(val_items)} prompts used for validation (data.max_val_samples)")
        return lines
    if command == "sft":
        from reinforge.trainers.sft import load_sft_data

        train, val, skipped = load_sft_data(plan, tok)
        what = "packed rows" if d.packing else "rows"
        lines = [f"data.train_files: {len(train)} {what}{_skipped(skipped, f'data.max_length={d.max_length}')}"
                 f"; {_steps(plan.with_data(len(train)).total_steps)} of {d.batch_size}"]
    else:
        from reinforge.trainers.preference_common import load_pairs, unpaired

        train, val, skipped = load_pairs(plan, tok)
        unit = "labelled completions" if unpaired(cfg) else "pairs"
        lines = [f"data.train_files: {len(train)} training {unit}"
                 f"{_skipped(skipped, f'data.max_length={d.max_length}')}"
                 f"; {_steps(plan.with_data(len(train)).total_steps)} of {d.batch_size}"]
    if val:
        lines.append(f"held-out: {len(val)} {'rows' if command == 'sft' else unit}")
    return lines


def _length_line(train, limit: int) -> list[str]:
    """The training prompts' token counts (as encoded: chat template applied, no special tokens
    added), against the limit: what to set data.max_prompt_length from."""
    lengths = sorted(len(item["prompt_ids"]) for part in getattr(train, "parts", [train])
                     for item in getattr(part, "items", []))
    if not lengths:
        return []
    return [f"prompt tokens: {lengths[0]} min, {statistics.median(lengths):g} median, {lengths[-1]} max "
            f"(data.max_prompt_length={limit})"]


def _stop_text(cfg, tok) -> str:
    """"; stops at <ids' tokens>": what a rollout ends a response at (workers/rollout/common.py:
    the tokenizer's EOS, the generation config's, the chat template's end of turn), read from
    generation_config.json without loading the model."""
    from reinforge.workers.rollout.common import stop_tokens

    if cfg.rollout.ignore_eos:
        return "; stops at no token (rollout.ignore_eos)"
    gen = Path(cfg.model.path) / "generation_config.json"
    eos = json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id") if gen.is_file() else None
    return "; stops at " + ", ".join(tok.convert_ids_to_tokens(stop_tokens(tok, eos)))


def dry_run(command: str, cfg, resume, overwrite: bool) -> list[str]:
    """Run every pre-training check of `command` on `cfg` (raising the run's own errors) and
    return the summary lines."""
    from reinforge.trainers.checkpoint import latest_checkpoint
    from reinforge.trainers.plan import resolve, resolve_supervised
    from reinforge.trainers.run_dir import check_reuse

    plan = resolve(cfg) if command == "train" else resolve_supervised(cfg)
    cfg = plan.cfg  # the resolved copy: Hub ids replaced by their snapshot folders
    run_dir = cfg.trainer.run_dir
    check_reuse(run_dir, bool(resume), overwrite)
    state = writable_run_dir(run_dir)
    if resume is True:
        ckpt = latest_checkpoint(Path(run_dir) / "checkpoints")
        state += f"; resumes from {ckpt}" if ckpt else "; no checkpoint yet: starts at step 0"
    elif resume:
        state += f"; resumes from {resume}"
    m = cfg.model
    from reinforge.trainers.rl_setup import load_processing

    tok, encoder = load_processing(m)  # a vision-language model's rows are read with its processor
    rewards = [spec for _, spec, _ in plan.reward_functions]  # (key, spec, style)
    if "reward.reward_model_path" in plan.model_folders:
        rewards.append(f"reward model {plan.model_folders['reward.reward_model_path']}")
    stops = _stop_text(cfg, tok) if command == "train" else ""
    return [_model_line(cfg), *_memory_lines(command, plan), f"tokenizer: {type(tok).__name__}, {len(tok)} tokens{stops}",
            *_data_lines(command, plan, encoder),
            f"reward functions: {', '.join(rewards) if rewards else 'none'}",
            *(_agent_lines(cfg) if command == "train" else []), f"trainer.run_dir={run_dir} ({state})"]


def _memory_lines(command: str, plan) -> list[str]:
    """How the update fits in memory, as the plan chose it (models/shape_defaults.resolve_memory)."""
    if command != "train":
        return [f"gradient checkpointing {'on' if plan.gradient_checkpointing else 'off'} "
                f"(model.gradient_checkpointing={plan.cfg.model.gradient_checkpointing}); "
                f"micro-batch {plan.micro_batch_size}"]
    return [f"actor: micro-batch {plan.actor_micro_batch_size} of a mini-batch of {plan.actor_mini_batch_size} "
            f"sequences; {plan.memory}", f"log-probs: {plan.logprob_path}"]


def _agent_lines(cfg) -> list[str]:
    """What episodes an RL run with rollout.max_turns > 1 plays (its tools or environment)."""
    r = cfg.rollout
    if r.max_turns == 1:
        return []
    what = f"environment {r.env}" if r.env else f"tools {', '.join(map(str, r.tools)) or 'from the rows'} " \
                                                 f"({r.tool_parser} format)"
    return [f"episodes: up to {r.max_turns} turns, {r.max_response_length} tokens after the prompt; {what}"]
