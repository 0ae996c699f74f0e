"""Rewards of multi-turn episodes: the trajectory keyword, per-turn rewards and where they sit,
environment rewards in the score, whole-episode text; and the agent config keys' errors."""
from __future__ import annotations

import pytest
import torch

from reinforge.rewards.episodes import turn_level_scores
from reinforge.config.load import ConfigError, load_config
from reinforge.config.schema import AlgorithmConfig, RewardConfig, RLConfig
from reinforge.protocol import Batch
from reinforge.rewards import RewardError, RewardManager
from reinforge.tasks import build_char_tokenizer
from reinforge.trainers.plan import resolve
from reinforge.workers.reward import RewardWorker

TRAJ = [{"turns": 2, "turn_ends": [1, 5], "turn_rewards": [0.5, 0.0]},
        {"turns": 1, "turn_ends": [2], "turn_rewards": [0.0]}]


def per_turn(prompt, response, ground_truth, trajectory=None, **extra):
    return [1.0] * trajectory["turns"]


def two_turns(prompt, response, ground_truth, trajectory=None, **extra):
    return [1.0, 1.0]


def scalar(prompt, response, ground_truth, **extra):
    assert "trajectory" not in extra  # only functions that name it receive it
    return 2.0


def batched_traj(prompts, responses, ground_truths, extras, trajectories=None):
    return [float(t["turns"]) for t in trajectories]


batched_traj.batched = True
# In-process calls (no worker process to start): these return at once.
per_turn.bounded = two_turns.bounded = scalar.bounded = True


def test_turn_level_scores_by_hand():
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]])
    fn_turns = [[0.25, 0.75], None]
    out = turn_level_scores(torch.tensor([3.0, 1.0]), mask, TRAJ, fn_turns)
    # row 0: turn 1 gets env 0.5 + fn 0.25 at index 1; turn 2 gets 0.75 + the rest 3 - 1.5 at index 5
    assert out.tolist() == [[0, 0.75, 0, 0, 0, 2.25, 0], [0, 0, 1.0, 0, 0, 0, 0]]


def test_manager_passes_trajectories_and_keeps_per_turn_lists():
    with RewardManager([(per_turn, 0.5), scalar, batched_traj], num_workers=0) as m:
        result = m.score(["p", "q"], ["a", "b"], ["1", "2"], trajectories=TRAJ)
        assert result.scores == [0.5 * 2 + 2 + 2, 0.5 * 1 + 2 + 1]
        assert result.turn_scores == [[0.5, 0.5], [0.5]]
    with RewardManager([two_turns], num_workers=0, max_error_rate=0.0) as m:  # a list that misses a turn: an error
        with pytest.raises(RewardError, match="per-turn reward has 2 values for an episode of 3 turns"):
            m.score(["p"], ["a"], ["1"], trajectories=[{**TRAJ[0], "turns": 3}])


def test_reward_worker_reads_whole_episodes_and_adds_environment_rewards():
    tok = build_char_tokenizer()
    ids = tok("ab<r>c</r>d", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    T = 16
    resp = torch.full((1, T), tok.pad_token_id)
    resp[0, :len(ids)] = torch.as_tensor(ids)
    gen = torch.zeros(1, T, dtype=torch.long)
    gen[0, :2], gen[0, 10:12] = 1, 1
    valid = (torch.arange(T) < len(ids)).long()[None]
    traj = [{"turns": 2, "turn_ends": [1, 11], "turn_rewards": [1.0, 0.0], "messages": []}]
    batch = Batch({"prompts": torch.zeros(1, 2, dtype=torch.long), "responses": resp, "response_mask": gen,
                   "attention_mask": torch.cat([torch.ones(1, 2, dtype=torch.long), valid], 1)},
                  {"prompt_text": ["p"], "ground_truth": ["d"], "extra": [{}], "trajectory": traj})
    seen = []

    def fn(prompt, response, ground_truth, trajectory=None, **extra):
        seen.append(response)
        return 0.5

    w = RewardWorker(tok, RewardConfig(functions=[{"name": fn}], num_workers=0), AlgorithmConfig(),
                     max_response_length=T)
    out = w.score(batch).batch()
    w.close()
    assert seen == ["ab<r>c</r>d"]  # observations included, EOS dropped
    assert out["seq_scores"].tolist() == [1.5] and out["acc"].tolist() == [1.0]
    assert out["token_level_scores"][0, 1] == 1.0 and out["token_level_scores"][0, 11] == 0.5
    assert out["token_level_scores"].sum() == 1.5


@pytest.mark.parametrize("overrides, needle", [
    (["rollout.tools=[calculator]"], "set rollout.max_turns > 1"),
    (["rollout.max_turns=0"], "rollout.max_turns"),
    (["rollout.max_turns=2", "rollout.tool_parser=json"], "rollout.tool_parser"),
    (["rollout.max_turns=2", "rollout.tools=[calculator]", "rollout.env=guess_number"], "set one of them"),
    (["rollout.max_turns=2", "rollout.ignore_eos=true"], "rollout.ignore_eos"),
    (["rollout.max_turns=2", "rollout.tools=[calculater]"], "rollout.tools[0]: unknown tool 'calculater'"),
    (["rollout.max_turns=2", "rollout.env=python:nowhere_mod:Env"], "rollout.env: environment"),
])
def test_agent_config_errors(tiny_model_dir, arith_data, tmp_path, overrides, needle):
    base = [f"model.path={tiny_model_dir}", f"data.train_files=[{arith_data['train']}]",
            f"trainer.run_dir={tmp_path}", "reward.functions=[auto]", "data.max_prompt_length=8",
            "rollout.max_response_length=16"]
    with pytest.raises(ConfigError) as err:
        resolve(load_config(RLConfig, "grpo", base + overrides))
    assert needle in str(err.value)


def test_an_environment_alone_may_score_episodes(tiny_model_dir, arith_data, tmp_path):
    from reinforge.config.validate import validate

    base = [f"model.path={tiny_model_dir}", f"data.train_files=[{arith_data['train']}]", "data.max_prompt_length=8",
            "rollout.max_response_length=16", "reward.functions=[]"]
    validate(load_config(RLConfig, "grpo", base + ["rollout.max_turns=3", "rollout.env=guess_number"]))
    with pytest.raises(ConfigError, match="nothing scores the responses"):
        validate(load_config(RLConfig, "grpo", base + ["rollout.max_turns=3", "rollout.tools=[calculator]"]))


def test_dry_run_names_the_episodes(tiny_model_dir, arith_data, tmp_path, capsys):
    from reinforge.cli.main import main

    rc = main(["train", "--config", "grpo", "--dry-run", f"model.path={tiny_model_dir}",
               f"data.train_files=[{arith_data['train']}]", f"trainer.run_dir={tmp_path / 'r'}", "reward.functions=[auto]",
               "data.max_prompt_length=8", "rollout.max_response_length=16", "rollout.max_turns=3",
               "rollout.tools=[calculator]"])
    assert rc == 0
    assert "episodes: up to 3 turns, 16 tokens after the prompt; tools calculator (tag format)" in capsys.readouterr().out
