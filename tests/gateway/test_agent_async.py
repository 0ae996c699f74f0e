"""rollout.agent with the asynchronous trainer (rollout.staleness > 0) and the weight version
across a resume: the producer drives the agents through a gateway over the behaviour copy, every
call is stamped with the version that sampled it, the rows carry it, and the captured log-probs
are the behaviour log-probs truncated IS reads."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from reinforge.config.load import load_config
from reinforge.config.schema import RLConfig
from reinforge.trainers.rl import RLTrainer
from tests.conftest import fit_until_crash, rl_overrides

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]
AGENTS = Path(__file__).with_name("gateway_agents.py")
SMALL = {"data.train_batch_size": 2, "rollout.n": 2, "trainer.total_steps": 3, "trainer.save_every": 1,
         "trainer.keep_last": 3, "trainer.export_hf": False, "trainer.val_before_train": False,
         "trainer.val_every": 100}


def _cfg(tiny_model_dir, arith_data, run_dir, **extra) -> RLConfig:
    over = rl_overrides(tiny_model_dir, arith_data, str(run_dir), **{"rollout.agent": f"{AGENTS}:versioned",
                                                                   "reward.functions": "[]", **SMALL, **extra})
    return load_config(RLConfig, "grpo", over)


def _steps(run_dir: Path) -> dict[int, dict]:
    """metrics.jsonl's training rows by step (a resumed run's rows replace the crashed run's)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "actor/pg_loss" in r}


def test_a_resumed_run_continues_the_weight_version(tiny_model_dir, arith_data, tmp_path):
    """Synchronous: step s samples with the weights of s - 1 completed steps, and so does the
    first step after a resume from the checkpoint of step 2 (not a count restarted at 0)."""
    fit_until_crash(RLTrainer(_cfg(tiny_model_dir, arith_data, tmp_path)), 3)
    assert sorted(_steps(tmp_path)) == [1, 2]
    RLTrainer(_cfg(tiny_model_dir, arith_data, tmp_path)).fit(resume=True)
    steps = _steps(tmp_path)
    assert {s: r["agent/metrics/weight_version"] for s, r in steps.items()} == {1: 0.0, 2: 1.0, 3: 2.0}


def _record(monkeypatch) -> tuple[dict, list]:
    """Spy on the gateway's captured calls (by rollout id) and on the batches the trainer takes
    from the producer."""
    from reinforge.gateway.server import Gateway
    from reinforge.trainers import async_rollout

    calls, batches = {}, []
    end, collect = Gateway.end_rollout, async_rollout.collect

    def end_rollout(self, rid):
        log = end(self, rid)
        calls[rid] = list(log.calls)
        return log

    def spy_collect(*a, **k):
        out = collect(*a, **k)
        batches.append(out[0])
        return out

    monkeypatch.setattr(Gateway, "end_rollout", end_rollout)
    monkeypatch.setattr(async_rollout, "collect", spy_collect)
    return calls, batches


def test_async_agents_train_with_stamped_versions_and_resume(tiny_model_dir, arith_data, tmp_path, monkeypatch):
    extra = {"rollout.staleness": 1, "rollout.agent_history": "drop", "rollout.agent": f"{AGENTS}:two_turns_versioned",
             "rollout.max_response_length": 16}
    calls, batches = _record(monkeypatch)
    trainer = RLTrainer(_cfg(tiny_model_dir, arith_data, tmp_path, **extra))
    fit_until_crash(trainer, 3)
    steps = _steps(tmp_path)
    assert sorted(steps) == [1, 2] and len(batches) == 2
    for s, (r, b) in enumerate(zip([steps[1], steps[2]], batches), start=1):
        lag = (s - 1) - b["policy_version"]
        assert 0 <= int(lag.min()) and int(lag.max()) <= 1  # bounded staleness: k = 1
        assert r["rollout/staleness_max"] == float(lag.max()) and "rollout/is_weight_mean" in r
        assert r["agent/gateway/dropped"] == 0.0
        # what the agents saw in the answers is what the rows carry
        assert r["agent/metrics/weight_version"] == pytest.approx(float(b["policy_version"].float().mean()))
        by_ids = {(c.prompt_ids, c.sampled_ids): c for cs in calls.values() for c in cs}
        for i in range(len(b)):
            m = b["response_mask"][i].bool()
            chain = [c for c in _chain(b, i, by_ids)]
            assert len(chain) == 2  # the run's two calls, rebuilt into this row
            assert {c.version for c in chain} == {int(b["policy_version"][i])}  # weights change between chunks only
            # each sampled token's version is its call's stamp
            assert b["token_versions"][i][m].tolist() == [c.version for c in chain for _ in c.sampled_ids]
            # the behaviour log-probs per-token TIS reads are the captured ones, token for token
            want = torch.tensor([lp for c in chain for lp in c.log_probs])
            torch.testing.assert_close(b["rollout_log_probs"][i][m], want, atol=0, rtol=0)
    RLTrainer(_cfg(tiny_model_dir, arith_data, tmp_path, **extra)).fit(resume=True)
    steps = _steps(tmp_path)
    assert sorted(steps) == [1, 2, 3]
    # the producer restarts at the checkpoint's version: the first rows after it were sampled by it
    assert steps[3]["agent/metrics/weight_version"] == 2.0 and steps[3]["rollout/staleness_max"] == 0.0
    assert "rollout/is_weight_mean" in steps[3]


def _chain(b, i: int, by_ids: dict) -> list:
    """Row i's calls, found by their prompt and sampled ids: the first call's prompt is the
    row's prompt, and each call's sampled ids follow in the response."""
    P = b["prompts"].shape[1]
    prompt = tuple(b["prompts"][i][b["attention_mask"][i, :P].bool()].tolist())
    resp = b["responses"][i][b["attention_mask"][i, P:].bool()].tolist()
    mask = b["response_mask"][i].tolist()
    out, ctx, t = [], prompt, 0
    while t < len(resp):
        while t < len(resp) and not mask[t]:
            t += 1
        start = t
        while t < len(resp) and mask[t]:
            t += 1
        if t == start:
            break
        sampled = tuple(resp[start:t])
        ctx = prompt + tuple(resp[:start])
        out.append(by_ids[(ctx, sampled)])
    return out


@pytest.mark.parametrize("staleness", [0, 1])
def test_split_histories_train(tiny_model_dir, arith_data, tmp_path, monkeypatch, staleness):
    """rollout.agent_history=split: a run whose history was edited gives two rows, both trained
    with its group (asynchronous: taken with its group from the producer's chunk; the update
    stays one on-policy mini-batch with the extra rows)."""
    batches = []
    collect = RLTrainer.collect_batch

    def spy(self):
        out = collect(self)
        batches.append(out[0])
        return out

    monkeypatch.setattr(RLTrainer, "collect_batch", spy)
    extra = {"rollout.staleness": staleness, "rollout.agent": f"{AGENTS}:edits_history", "trainer.total_steps": 2,
             "trainer.save_every": 100, "rollout.max_response_length": 16, "data.max_prompt_length": 32}
    RLTrainer(_cfg(tiny_model_dir, arith_data, tmp_path, **extra)).fit()
    steps = _steps(tmp_path)
    assert sorted(steps) == [1, 2] and [len(b) for b in batches] == [8, 8]  # 2 prompts x 2 runs x 2 sequences
    for b in batches:
        ids, counts = torch.unique(b["group_ids"], return_counts=True)
        assert len(ids) == 2 and counts.tolist() == [4, 4]
    assert all(r["agent/gateway/edited_calls"] >= 2 and r["agent/gateway/sequences"] >= 8 for r in steps.values())


def test_async_runs_past_their_deadline_are_void_rows(tiny_model_dir, arith_data, tmp_path, monkeypatch):
    _, batches = _record(monkeypatch)
    extra = {"rollout.staleness": 1, "rollout.agent": f"{AGENTS}:hangs_on_even", "rollout.agent_timeout_s": 1.0,
             "trainer.total_steps": 2, "trainer.save_every": 100}
    RLTrainer(_cfg(tiny_model_dir, arith_data, tmp_path, **extra)).fit()
    steps = _steps(tmp_path)
    assert sorted(steps) == [1, 2]
    dropped = sum(r["agent/gateway/dropped_timeout"] for r in steps.values())
    void = sum(int((b["group_ids"] < 0).sum()) for b in batches)
    assert dropped >= 1 and void >= 1
    for b in batches:  # a void row trains no token
        assert int(b["response_mask"][b["group_ids"] < 0].sum()) == 0


def test_stopping_cuts_a_hung_chunk_short(tiny_model_dir, arith_data, tmp_path):
    """The run ends while the producer's next chunk waits on hung agents (deadline 120 s): the
    producer's stop ends them at once instead of waiting for their deadline."""
    import time

    extra = {"rollout.staleness": 1, "rollout.agent": f"{AGENTS}:hangs_after_four", "rollout.agent_timeout_s": 120,
             "trainer.total_steps": 1, "trainer.save_every": 100}
    trainer = RLTrainer(_cfg(tiny_model_dir, arith_data, tmp_path, **extra))
    trainer.val_items = []  # the agents validation would run hang too
    t0 = time.monotonic()
    trainer.fit()
    assert time.monotonic() - t0 < 30
    assert sorted(_steps(tmp_path)) == [1]
