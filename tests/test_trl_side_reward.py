"""benchmarks/trl_side.py restates reinforge's reasoning_gym reward (TRL's side never imports
reinforge): the two must score every reply alike, or the learning comparison compares rewards."""
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("reasoning_gym")

from reinforge.data.io import load_rows  # noqa: E402
from reinforge.data.reasoning_gym import make_reasoning_gym_data  # noqa: E402
from reinforge.rewards.reasoning_gym import extract_answer, reasoning_gym_reward  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _trl_side():
    spec = importlib.util.spec_from_file_location("trl_side", ROOT / "benchmarks" / "trl_side.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # its TRL imports are inside main()
    return mod


REPLIES = ["<answer>-103</answer>", "so it is <answer> 12 </answer> and <answer>-103</answer>", "-103",
           "The sum is 1,024.", "15 - 43 = -28, then -28 - 75 = -103", "no number here", "", "   ",
           "<answer></answer>", "2.5 or 3", "<answer>abc</answer> 7"]


@pytest.mark.parametrize("truth", ["-103", "1024", "abc"])
def test_extraction_rule_is_reinforges(truth):
    side = _trl_side()
    for reply in REPLIES:
        assert side.extract_answer(reply, truth) == extract_answer(reply, truth), reply


def test_scores_equal_reinforges(tmp_path):
    side = _trl_side()
    d = make_reasoning_gym_data("chain_sum", str(tmp_path), n_train=3, n_test=1, seed=0,
                                options={"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2})
    rows = load_rows(d["train"])
    for row in rows:
        truth = row["reward_model"]["ground_truth"]
        replies = [f"<answer>{truth}</answer>", f"it is {truth}", f"<answer>{int(truth) + 1}</answer>", "",
                   [{"role": "assistant", "content": f"<answer>{truth}</answer>"}]]
        k = len(replies)
        got = side.reasoning_gym_reward(replies, [row["reward_model"]] * k, [row["extra_info"]] * k)
        want = [reasoning_gym_reward("", r if isinstance(r, str) else r[-1]["content"], truth,
                                     extra_info=row["extra_info"])["score"] for r in replies]
        assert got == pytest.approx(want)
        assert got[0] == 1.0 and got[3] == 0.0
