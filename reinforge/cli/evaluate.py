"""`reinforge eval`: greedy accuracy, sampled mean@n and pass@k of a model folder on a prompt file."""
from __future__ import annotations

import json

from reinforge.config.schema import AlgorithmConfig, RewardConfig
from reinforge.config.validate import resolve_device
from reinforge.models.loading import load_causal_lm, load_tokenizer
from reinforge.trainers.validation import validate
from reinforge.workers.reward import RewardWorker
from reinforge.workers.rollout.hf import HFRollout


def main(args) -> int:
    from reinforge.data import RLDataset

    device = resolve_device("auto")
    tok = load_tokenizer(args.model)
    model = load_causal_lm(args.model, device=device, train=False)
    data = RLDataset(args.data, tok, max_prompt_length=args.max_prompt_length)
    items = [data[i] for i in range(min(len(data), args.max_samples))]
    rollout = HFRollout(model, tok, max_prompt_length=args.max_prompt_length,
                        max_response_length=args.max_response_length)
    reward = RewardWorker(tok, RewardConfig(functions=[{"name": args.reward, "weight": 1.0}]), AlgorithmConfig(),
                          max_response_length=args.max_response_length, device=device)
    ks = [k for k in (1, 2, 4, 8, 16) if k <= args.n]
    try:
        metrics = validate(rollout, reward, items, n=args.n, temperature=1.0, pass_k=ks, batch_size=64)
    finally:
        reward.close()
    print(json.dumps(metrics, indent=2))
    return 0
