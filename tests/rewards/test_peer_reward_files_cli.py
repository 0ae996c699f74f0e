"""Reward files written for veRL and TRL, unchanged, through the `reinforge` console script
(issue 22): a veRL gsm8k-schema file with chat prompts, a tiny Qwen2 with the real Qwen2
vocabulary, and, run from another working directory, a veRL dataset scorer that imports a
module beside it and a veRL custom reward reading extra_info. (A TRL reward calling math_verify
with its default timeouts: tests/rewards/test_peer_rewards.py, the same RewardManager.)
The subprocess costs ~10 s of imports (torch, transformers) on a 2-core machine; the step ~1.5 s."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

HELPERS = r'''
import re

def last_answer(text):
    found = re.findall(r"#### (-?[0-9.,]+)", text)
    return found[-1].replace(",", "") if found else None
'''
VERL_SCORER = '''
from gsm8k_helpers import last_answer  # beside this file: no PYTHONPATH needed

def compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
    answer = last_answer(solution_str)
    return 0.0 if answer is None else (score if answer == ground_truth else format_score)
'''
VERL_CUSTOM = '''
def gsm8k_custom(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(data_source == "openai/gsm8k"), "index": float(extra_info["index"])}
'''


def _console_script() -> list[str]:
    """The installed entry point (its sys.path has neither the working directory nor the reward
    file's folder); else the module with -P, which leaves the working directory out too."""
    script = Path(sys.executable).parent / "reinforge"
    return [str(script)] if script.exists() else [sys.executable, "-P", "-m", "reinforge.cli.main"]


@pytest.mark.slow
def test_peer_reward_files_unchanged_through_the_console_script(tmp_path):
    from transformers import AutoTokenizer

    from reinforge.data.io import write_rows
    from reinforge.data.preprocess import rl_row
    from reinforge.models.tiny import make_tiny_model
    from reinforge.models.vocabs import vocab_folder

    tok = AutoTokenizer.from_pretrained(vocab_folder("qwen2"))
    model = tmp_path / "model"
    make_tiny_model(tok, str(model), hidden_size=16, num_layers=2, num_heads=2, num_kv_heads=1,
                    intermediate_size=32, max_positions=128)
    question = "Natalia sold 48 clips in April and half as many in May. How many in all? Answer after \"####\"."
    rows = [rl_row("openai/gsm8k", [{"role": "user", "content": question}], "math", "72", "train", i,
                   {"answer": "48 + 24 = 72\n#### 72"}) for i in range(4)]
    data = write_rows(rows, str(tmp_path / "gsm8k.parquet"))
    rewards = tmp_path / "rewards"
    rewards.mkdir()
    for name, text in {"gsm8k_helpers.py": HELPERS, "verl_scorer.py": VERL_SCORER, "verl_custom.py": VERL_CUSTOM}.items():
        (rewards / name).write_text(text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    functions = "[{name: ../rewards/verl_scorer.py:compute_score}, {name: ../rewards/verl_custom.py:gsm8k_custom}]"
    overrides = {"model.path": model, "data.train_files": f"[{data}]", "data.max_prompt_length": 64,
                 "rollout.max_response_length": 4, "data.train_batch_size": 2, "rollout.n": 2,
                 "trainer.total_steps": 1, "actor.micro_batch_size": 4, "trainer.run_dir": run,
                 "reward.functions": functions, "trainer.loggers": "[jsonl]", "trainer.progress": False,
                 "trainer.report": False, "trainer.export_hf": False}
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*_console_script(), "train", "--config", "grpo", *(f"{k}={v}" for k, v in overrides.items())],
                          cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    step = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert step["reward/errors"] == 0 and step["reward/timeouts"] == 0
    assert step["reward/compute_score/mean"] == 0  # a random model does not answer "#### 72"
    assert step["reward/gsm8k_custom/mean"] == 1.0  # data_source reached the veRL custom signature
    # extra_info reached it too, and the dict's other key is logged: the mean index of two of
    # the four rows, each sampled twice, is a half-integer in 0.5 .. 2.5.
    assert step["reward/gsm8k_custom/index"] in (0.5, 1.0, 1.5, 2.0, 2.5)
    samples = [json.loads(x) for f in (run / "samples").glob("*step_*.jsonl") for x in f.read_text().splitlines()]
    assert samples and all("<|im_start|>user\n" + question + "<|im_end|>\n<|im_start|>assistant\n" in s["prompt"]
                           for s in samples), samples[:1]
