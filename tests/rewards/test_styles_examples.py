"""The reward examples of docs/rewards.md (examples/*.py), each run through the RewardManager on a
small batch of rows read the way training reads them (veRL-schema arithmetic rows)."""
from pathlib import Path

import pytest

from reinforge.rewards import RewardManager
from reinforge.trainers.inputs import PromptDataset

EXAMPLES = Path(__file__).parent.parent.parent / "examples"
ROWS = [{"data_source": "arithmetic", "prompt": f"{a}+{b}=", "reward_model": {"style": "rule", "ground_truth": str(a + b)},
         "extra_info": {"split": "train", "index": i}} for i, (a, b) in enumerate([(1, 2), (3, 4), (5, 6), (7, 8)])]
RESPONSES = ["3", "the sum is 7", "12", "x"]  # right, right inside text, wrong, no number


@pytest.fixture(scope="module")
def batch():
    from reinforge.tasks import build_char_tokenizer

    items = list(PromptDataset(ROWS, build_char_tokenizer(), name="python:train_dataset", max_prompt_length=8))
    return [it["prompt_text"] for it in items], RESPONSES, [it["ground_truth"] for it in items], \
        [it["extra"] for it in items]


def score(spec, batch, **kwargs):
    prompts, responses, gts, extras = batch
    with RewardManager([spec], **kwargs) as m:
        ids = [list(range(len(r))) for r in responses]  # one token a character, as the char tokenizer
        result = m.score(prompts, responses, gts, extras, completion_ids=ids)
        return (result.scores, result.metrics), m.fns[0].call


def test_verl_example(batch):
    (scores, metrics), call = score(f"{EXAMPLES}/reward_verl.py:compute_score", batch)
    assert call.style == "verl" and scores == [1.0, 1.0, 0.0, 0.0]
    assert metrics["reward/compute_score/has_number"] == 0.75 and metrics["reward/errors"] == 0


def test_trl_examples(batch):
    (scores, metrics), call = score((f"{EXAMPLES}/reward_trl.py:accuracy_reward", 1.0), batch)
    assert (call.style, call.batched) == ("trl", True) and scores == [1.0, 0.0, 0.0, 0.0]
    (scores, _), _ = score((f"{EXAMPLES}/reward_trl.py:brevity_reward", 0.1), batch)
    assert scores == pytest.approx([-0.01, -0.12, -0.02, -0.01])


def test_reinforge_example(batch):
    (scores, metrics), call = score(f"{EXAMPLES}/reward_reinforge.py:digits_then_exact", batch)
    assert call.style == "reinforge" and scores == [1.0, 0.0, 0.2, 0.0]
    assert metrics["reward/digits_then_exact/exact"] == 0.25


def test_async_example(batch):
    (scores, metrics), call = score(f"{EXAMPLES}/reward_async.py:judge", batch, timeout_s=5.0)
    assert call.is_async and scores == [1.0, 0.0, 0.0, 0.0] and metrics["reward/timeouts"] == 0
