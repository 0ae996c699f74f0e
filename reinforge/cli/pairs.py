"""`reinforge data pairs`: preference data a model samples and a reward ranks. Each prompt of an
RL-schema file gets --n samples (the lean rollout, --temperature); the reward scores them; the
best and worst of each group become a DPO pair (prefs.parquet) and KTO rows (kto.parquet), by
data/pairs.rank_samples. The prompt column holds the prompt as the model saw it (chat template
rendered), so DPO / KTO train on exactly the tokens that were sampled from."""
from __future__ import annotations

import json
from pathlib import Path

from reinforge.config.load import ConfigError
from reinforge.trainers.preflight import check_model_flag, check_reward_function, check_reward_rows


def check_args(args) -> None:
    """Every input checked before a model loads; ConfigError naming the flag."""
    args.model = check_model_flag(args.model, "--model")
    check_reward_function(args.reward, "--reward")
    if not Path(args.data).is_file():
        raise ConfigError(f"--data={args.data!r}: no such file (an RL-schema parquet/JSONL file of prompts)")
    if args.n < 2:
        raise ConfigError(f"--n={args.n}: a pair needs at least 2 samples per prompt")
    if not args.temperature > 0:
        raise ConfigError(f"--temperature={args.temperature}: sampling needs a temperature > 0")
    check_reward_rows([("--reward", args.reward, None)], [args.data])


def sample_and_score(model, tok, args) -> tuple[list[str], list[str], list[float], list[bool]]:
    """(prompts (P,), responses, scores, finished (P * n,)) of the first --max-samples prompts."""
    import torch

    from reinforge.config.schema import AlgorithmConfig, RewardConfig, RolloutConfig
    from reinforge.data import RLDataset
    from reinforge.protocol import Batch
    from reinforge.trainers.validation import prompts_batch
    from reinforge.workers.reward import RewardWorker
    from reinforge.workers.rollout import build_rollout

    items = list(RLDataset(args.data, tok, max_prompt_length=args.max_prompt_length,
                           length_key="--max-prompt-length"))[:args.max_samples]
    r = RolloutConfig(max_response_length=args.max_response_length, micro_batch_size=args.batch_size * args.n)
    rollout = build_rollout("lean", model, tok, r, max_prompt_length=args.max_prompt_length)
    reward = RewardWorker(tok, RewardConfig(functions=[{"name": args.reward, "weight": 1.0}]), AlgorithmConfig(),
                          max_response_length=args.max_response_length, device="cpu")
    torch.manual_seed(args.seed)
    outs = []
    try:
        for part in prompts_batch(items, 0).split(args.batch_size):
            b = rollout.generate(part, n=args.n, temperature=args.temperature)
            outs.append(b | reward.score(b).batch())
    finally:
        reward.close()
    out = Batch.concat(outs)
    return ([it["prompt_text"] for it in items], list(out["response_text"]), out["seq_scores"].tolist(),
            (~out["truncated"].bool()).tolist())


def main(args) -> int:
    from reinforge.data.pairs import rank_samples, write_pairs
    from reinforge.models.loading import load_causal_lm, load_tokenizer

    check_args(args)
    tok = load_tokenizer(args.model)
    model = load_causal_lm(args.model, train=False)
    prompts, responses, scores, finished = sample_and_score(model, tok, args)
    pairs, unpaired = rank_samples(prompts, responses, scores, args.n, finished)
    paths = write_pairs(args.out, pairs, unpaired)
    summary = {"prompts": len(prompts), "samples": len(responses), "mean_score": sum(scores) / len(scores),
               "unfinished": finished.count(False), "pairs": len(pairs), "kto_rows": len(unpaired),
               "model": args.model, "data": args.data, "reward": args.reward, "n": args.n,
               "temperature": args.temperature, "seed": args.seed}
    (Path(args.out) / "pairs.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{len(pairs)} pairs from {len(prompts)} prompts x {args.n} samples (mean score "
          f"{summary['mean_score']:.3f}; groups with one score give none)\nprefs: {paths['prefs']}\n"
          f"kto: {paths['kto']}")
    if not pairs:
        print("no pairs: every group's samples scored alike (more samples, a higher temperature or easier prompts)")
    return 0
