"""`reinforge eval`: greedy accuracy, sampled mean@n and pass@k of a model folder on a prompt file."""
from __future__ import annotations

import json
from pathlib import Path

from reinforge.config.common import GenEvalConfig
from reinforge.config.load import ConfigError
from reinforge.data.hf_datasets import is_dataset_source
from reinforge.models.loading import load_causal_lm, load_tokenizer
from reinforge.trainers.plan import resolve_device
from reinforge.trainers.preflight import check_model_flag, check_reward_function, check_reward_rows
from reinforge.trainers.validation import PromptEvaluator


def main(args) -> int:
    # Every input is checked before the model loads, as in the training commands; a Hub id
    # (org/name[@revision]) is resolved to its cached snapshot first, as model.path is.
    args.model = check_model_flag(args.model, "--model")
    check_reward_function(args.reward, "--reward")
    if not (Path(args.data).is_file() or is_dataset_source(args.data)):
        raise ConfigError(f"--data={args.data!r}: no such file (give a parquet/JSONL file, a save_to_disk "
                          "folder or hf://datasets/ORG/NAME[:SPLIT])")
    if args.n < 0:
        raise ConfigError(f"--n={args.n}: samples per prompt must be >= 0 (0: greedy only)")
    check_reward_rows([("--reward", args.reward, None)], [args.data])
    device = resolve_device("auto")
    tok = load_tokenizer(args.model)
    model = load_causal_lm(args.model, device=device, train=False)
    e = GenEvalConfig(prompt_files=[args.data], reward_functions=[{"name": args.reward, "weight": 1.0}],
                      max_prompt_length=args.max_prompt_length, max_response_length=args.max_response_length,
                      max_samples=args.max_samples, n=max(args.n, 1), temperature=1.0, batch_size=64)
    evaluator = PromptEvaluator(model, tok, e, device=device, pass_k=(1, 2, 4, 8, 16))
    try:
        metrics = evaluator(sampled=args.n > 0)  # --n 0: the greedy pass alone
    finally:
        evaluator.close()
    print(json.dumps(metrics, indent=2))
    return 0
