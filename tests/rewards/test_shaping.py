"""Reward shaping: Kimi k1.5's group-relative length reward, the per-token penalty, format checks,
and the documented order format + overlong + length, then the clip (hand-computed tables), through
the pure functions, the reward worker and one RL step."""
from __future__ import annotations

import json

import pytest
import torch

from reinforge.config.load import ConfigError, load_config
from reinforge.config.schema import AlgorithmConfig, FormatConfig, LengthPenaltyConfig, RewardConfig, RLConfig
from reinforge.trainers.plan import plan_rl
from reinforge.protocol import Batch
from reinforge.rewards.shaping import (format_checker, kimi_length_reward, length_term, per_token_length_penalty,
                                       shape_scores)
from reinforge.tasks import build_char_tokenizer
from reinforge.trainers.rl import RLTrainer
from reinforge.workers.reward import RewardWorker
from tests.conftest import rl_overrides

pytestmark = pytest.mark.usefixtures("one_thread")


def test_kimi_length_reward_by_hand():
    # Groups interleaved: 0 -> rows 0, 2, 4 (L 2, 4, 6: lambda 0.5, 0, -0.5); 1 -> rows 1, 3
    # (L 3, 5: lambda 0.5, -0.5, both wrong: min(0, lambda)); 2 -> row 5 alone (one length: 0).
    lengths = torch.tensor([2, 3, 4, 5, 6, 7])
    correct = torch.tensor([True, False, False, False, True, True])
    groups = torch.tensor([0, 1, 0, 1, 0, 2])
    got = kimi_length_reward(lengths, correct, groups)
    assert got.tolist() == pytest.approx([0.5, 0.0, 0.0, -0.5, -0.5, 0.0])
    # Weighted by coef; without group ids the batch is one group (L 2..7: lambda 0.5 - (L - 2) / 5).
    assert length_term("kimi", lengths, correct, groups, 0.2, 0).tolist() == pytest.approx(
        [0.1, 0.0, 0.0, -0.1, -0.1, 0.0])
    one = length_term("kimi", lengths, correct, None, 1.0, 0)
    assert one.tolist() == pytest.approx([0.5, min(0.0, 0.3), 0.0, -0.1, -0.3, -0.5])


def test_per_token_penalty_by_hand():
    got = per_token_length_penalty(torch.tensor([3, 4, 5, 10]), free_tokens=4, coef=0.1)
    assert got.tolist() == pytest.approx([0.0, 0.0, -0.1, -0.6])
    assert length_term("none", torch.tensor([3, 9]), torch.tensor([True, False]), None, 1.0, 0).tolist() == [0.0, 0.0]


def test_format_checkers():
    think_answer = format_checker("think_answer")
    assert think_answer("<think>so 2</think> <answer>2</answer>")
    assert not think_answer("<think>a</think><answer></answer>")  # empty answer
    assert not think_answer("<think>a<think>b</think><answer>2</answer>")  # nested think
    assert not think_answer("<answer>2</answer>")
    assert format_checker("think")("<think>x</think>42") and not format_checker("think")("42")
    assert format_checker("boxed")("so \\boxed{12}.") and not format_checker("boxed")("\\boxed{}")
    digits = format_checker(r"re:\d+\.")  # the whole response must match
    assert digits("12.") and not digits("12") and not digits("a12.")
    with pytest.raises(ValueError, match="unknown format checker 'thinkk'"):
        format_checker("thinkk")
    with pytest.raises(ValueError, match="not a valid regular expression"):
        format_checker("re:(\\d")


# correct x well-formed x overlong, with format_score 0.2, format_penalty 0.5, DAPO's penalty -1
# at the maximum length, clip [-1, 1]: task + format + overlong, then the clip.
TABLE = [  # (correct, well-formed, overlong, shaped score)
    (1, 1, 0, 1.0),  # 1.2 clipped
    (1, 1, 1, 0.2),
    (1, 0, 0, 0.5),
    (1, 0, 1, -0.5),
    (0, 1, 0, 0.2),
    (0, 1, 1, -0.8),
    (0, 0, 0, -0.5),
    (0, 0, 1, -1.0),  # -1.5 clipped
]


def test_combination_table_pure():
    task = torch.tensor([float(c) for c, _, _, _ in TABLE])
    well = torch.tensor([bool(w) for _, w, _, _ in TABLE])
    over = torch.tensor([-1.0 * o for _, _, o, _ in TABLE])
    got = shape_scores(task, well_formed=well, format_score=0.2, format_penalty=0.5, overlong=over,
                       clip_min=-1.0, clip_max=1.0)
    assert got.tolist() == pytest.approx([s for *_, s in TABLE])
    # No clip: the terms simply add.
    assert shape_scores(task, well_formed=well, format_score=0.2, format_penalty=0.5, overlong=over)[[0, 7]].tolist() \
        == pytest.approx([1.2, -1.5])


def _worker_batch(tok, responses: list[str], truths: list[str], groups: list[int], T: int) -> Batch:
    ids = torch.full((len(responses), T), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(responses), T), dtype=torch.long)
    for b, r in enumerate(responses):
        enc = tok(r, add_special_tokens=False)["input_ids"]
        ids[b, :len(enc)], mask[b, :len(enc)] = torch.tensor(enc), 1
    n = len(responses)
    return Batch({"responses": ids, "response_mask": mask, "group_ids": torch.tensor(groups)},
                 {"prompt_text": ["q="] * n, "ground_truth": truths, "extra": [{"data_source": "x"}] * n})


def test_combination_table_through_the_reward_worker():
    """The same table from text: exact_match decides correctness, the regex `\\d+\\.` the format,
    10-token responses (max_response_length 10, buffer 4) the overlong penalty of -1; 5 tokens none."""
    tok = build_char_tokenizer()
    short_ok, long_ok, short_bad, long_bad = "1234.", "123456789.", "12345", "1234567890"
    responses = [short_ok, long_ok, short_bad, long_bad] * 2
    truths = responses[:4] + ["0"] * 4
    cfg = RewardConfig(functions=[{"name": "exact_match", "weight": 1.0}],
                       format=FormatConfig(check=r"re:\d+\.", score=0.2, penalty=0.5), clip_min=-1.0, clip_max=1.0)
    worker = RewardWorker(tok, cfg, AlgorithmConfig(overlong_buffer_len=4), max_response_length=10)
    result = worker.score(_worker_batch(tok, responses, truths, list(range(8)), 10))
    out, metrics = result.batch(), result.metrics
    assert out["seq_scores"].tolist() == pytest.approx([s for *_, s in TABLE])
    assert out["acc"].tolist() == [1.0] * 4 + [0.0] * 4  # correctness is read before shaping
    assert metrics["reward/format_ok_frac"] == 0.5 and metrics["reward/overlong_penalty_mean"] == -0.5
    assert metrics["reward/clipped_frac"] == 0.25 and "reward/length_penalty_mean" not in metrics
    last = out["token_level_scores"][1].nonzero().flatten().tolist()
    assert last == [9]  # on the last valid token


def test_kimi_through_the_reward_worker():
    tok = build_char_tokenizer()
    # One group: "7" right (L 1), "77" wrong (L 2), "777" wrong (L 3): lambda 0.5, 0, -0.5.
    cfg = RewardConfig(functions=[{"name": "exact_match", "weight": 1.0}],
                       length_penalty=LengthPenaltyConfig(kind="kimi", coef=0.4))
    worker = RewardWorker(tok, cfg, AlgorithmConfig(), max_response_length=4)
    result = worker.score(_worker_batch(tok, ["7", "77", "777"], ["7"] * 3, [5, 5, 5], 4))
    out, metrics = result.batch(), result.metrics
    assert out["seq_scores"].tolist() == pytest.approx([1.0 + 0.4 * 0.5, 0.0, 0.4 * -0.5])
    assert metrics["reward/length_penalty_mean"] == pytest.approx((0.2 + 0.0 - 0.2) / 3)


@pytest.mark.parametrize("override, message", [
    ("reward.length_penalty.kind=kimmi", "reward.length_penalty.kind='kimmi': none, kimi or per_token"),
    ("reward.format.check=re:(", "reward.format.check: 're:(' is not a valid regular expression"),
    ("reward.format.check=xml", "reward.format.check: unknown format checker 'xml'"),
    ("reward.length_penalty.coef=-1", "reward.length_penalty.coef=-1.0 is out of range"),
])
def test_bad_shaping_keys(tiny_model_dir, arith_data, tmp_path, override, message):
    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path / "r")) + [override])
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        plan_rl(cfg)


def test_clip_bounds_must_be_ordered(tiny_model_dir, arith_data, tmp_path):
    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path / "r"))
                      + ["reward.clip_min=1", "reward.clip_max=0"])
    with pytest.raises(ConfigError, match="reward.clip_min=1.0 must be below reward.clip_max=0.0"):
        plan_rl(cfg)


def test_rl_step_with_length_penalty_and_format(tiny_model_dir, arith_data, tmp_path):
    """One GRPO step with the per-token penalty, a format check and a clip: the metrics say each
    term ran, and the logged score respects the clip."""
    run = tmp_path / "run"
    over = {"trainer.total_steps": 1, "trainer.val_before_train": False, "data.val_files": "[]",
            "trainer.export_hf": False, "reward.length_penalty.kind": "per_token", "reward.length_penalty.coef": 0.05,
            "reward.length_penalty.free_tokens": 2, "reward.format.check": "'re:\\d+'", "reward.clip_min": -0.2,
            "reward.clip_max": 1.0}
    trainer = RLTrainer(load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(run), **over)))
    trainer.fit()
    trainer.close()
    row = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"step": 1' in x][-1]
    assert -0.05 * 4 - 1e-6 <= row["reward/length_penalty_mean"] <= 0.0  # at most 6 - 2 tokens charged
    assert 0.0 <= row["reward/format_ok_frac"] <= 1.0 and 0.0 <= row["reward/clipped_frac"] <= 1.0
    assert -0.2 <= row["critic/score/mean"] <= 1.0
