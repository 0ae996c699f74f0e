"""rollout.agent on trainer.backend=ray: each rank serves its share of the prompts' agents through a
gateway on its own loopback, and the driver merges the shares as one engine would return them
(distributed/engine.merge_shares): every share's B0 x n rows first, then the split sequences, the
dropped runs' groups numbered over the whole batch."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from reinforge.distributed.engine import merge_shares
from reinforge.protocol import Batch
from tests.conftest import rl_overrides
from tests.gateway.gateway_agents import mixed_kind

AGENTS = Path(__file__).parent.parent / "gateway" / "gateway_agents.py"


def _share(uids: list[int], n: int, extra_uids: list[int], void: set[int]) -> Batch:
    rows = [u for u in uids for _ in range(n)] + extra_uids
    gid = torch.tensor([-1 - k if u in void else u for k, u in enumerate(rows)])
    return Batch({"group_ids": gid, "uid_row": torch.tensor(rows)}, {"tag": [f"u{u}" for u in rows]})


def test_merge_shares_puts_every_shares_rows_before_the_extras():
    a = _share([0, 1], 2, extra_uids=[0], void={1})          # rank 0: prompts 0, 1; prompt 1's runs dropped
    b = _share([2, 3], 2, extra_uids=[3, 3], void={2})       # rank 1: prompts 2, 3
    out = merge_shares([a, b], [2, 2], n=2)
    assert out["uid_row"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 0, 3, 3]
    assert out["tag"] == [f"u{u}" for u in out["uid_row"].tolist()]
    assert out["group_ids"].tolist() == [0, 0, -1, -2, -3, -4, 3, 3, 0, 3, 3]  # voids unique, kept apart
    plain = _share([4], 3, extra_uids=[], void=set())
    assert torch.equal(merge_shares([plain], [1], n=3)["group_ids"], plain["group_ids"])


@pytest.mark.slow
def test_grpo_with_an_openai_client_agent_on_two_ranks(ray_cluster, tiny_model_dir, arith_data, tmp_path):
    """Prompts of each kind of `mixed` (an edited history, a raise, one call) split over 2 ranks:
    the round's counts are both ranks' summed, the step trains, validation reads its rows."""
    pytest.importorskip("openai")
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.data.io import load_rows, write_rows
    from reinforge.trainers.rl import RLTrainer

    rows, picked = load_rows(arith_data["train"]), {}
    for r in rows:  # one prompt of each kind, then one more of any: the whole first batch
        picked.setdefault(mixed_kind(r["prompt"]), r)
    batch = list(picked.values()) + [next(r for r in rows if r not in picked.values())]
    train = write_rows(batch, str(tmp_path / "train.parquet"))
    extra = {"rollout.agent": f"{AGENTS}:mixed", "reward.functions": "[]", "trainer.backend": "ray",
             "trainer.devices_per_node": 2, "trainer.val_before_train": False, "trainer.total_steps": 1,
             "trainer.val_every": 1, "data.train_files": f"[{train}]", "rollout.max_response_length": 24,
             "data.max_prompt_length": 16}
    run = tmp_path / "run"
    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(run), **extra))
    last = RLTrainer(cfg).fit()
    step = next(json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "actor/pg_loss" in x)
    kinds, n = [mixed_kind(r["prompt"]) for r in batch], cfg.rollout.n
    assert len(batch) == cfg.data.train_batch_size == 4 and set(kinds) == {0, 1, 2}
    assert step["agent/gateway/runs"] == 4 * n  # both ranks' rounds summed
    assert step["agent/gateway/dropped_raised"] == step["agent/gateway/dropped"] == n * kinds.count(1)
    assert step["agent/gateway/edited_calls"] == n * kinds.count(0)
    assert step["agent/gateway/sequences"] == n * (2 * kinds.count(0) + kinds.count(2))
    assert torch.isfinite(torch.tensor(last["actor/pg_loss"])) and "val/acc_greedy" in last


@pytest.mark.slow
def test_async_agents_on_two_rollout_workers(ray_cluster, tiny_model_dir, arith_data, tmp_path, monkeypatch):
    """trainer.backend=ray, rollout.staleness=1, 2 rollout-worker actors (distributed/rollout_workers.py):
    each worker serves its half of a chunk's agents through its own gateway; a step's counts are both
    workers' summed, the rows come back as one engine's (B0 x n, then the split sequences, the dropped
    runs' groups unique), every token stamped with the version that sampled it (one step: v0); the
    next chunk's agents, which hang, are interrupted at the end instead of awaiting their deadline."""
    pytest.importorskip("openai")
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.data.io import load_rows, write_rows
    from reinforge.distributed.rollout_workers import RayBehaviour
    from reinforge.trainers import async_rollout
    from reinforge.trainers.rl import RLTrainer

    rows, picked = load_rows(arith_data["train"]), {}
    for r in rows:  # one prompt of each kind, then one more of any: every chunk
        picked.setdefault(mixed_kind(r["prompt"]), r)
    batch = list(picked.values()) + [next(r for r in rows if r not in picked.values())]
    kinds = [mixed_kind(r["prompt"]) for r in batch]
    train = write_rows(batch, str(tmp_path / "train.parquet"))
    batches, collect = [], async_rollout.collect

    def spy_collect(*a, **k):
        out = collect(*a, **k)
        batches.append(out[0])
        return out

    monkeypatch.setattr(async_rollout, "collect", spy_collect)
    monkeypatch.setattr(RayBehaviour, "worker_cpus", 0.5)  # 1 rank + 2 workers on the session's 2 CPUs
    extra = {"rollout.agent": f"{AGENTS}:mixed_then_hangs", "reward.functions": "[]", "trainer.backend": "ray",
             "rollout.staleness": 1, "rollout.agent_timeout_s": 300, "trainer.val_every": 100,
             "trainer.rollout_workers": 2, "rollout.stream_prompts": 4,
             "trainer.val_before_train": False, "trainer.total_steps": 1, "trainer.export_hf": False,
             "data.train_files": f"[{train}]", "rollout.max_response_length": 16, "data.max_prompt_length": 16,
             "actor.use_kl_loss": False}
    run = tmp_path / "run"
    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(run), **extra))
    trainer = RLTrainer(cfg)
    trainer.val_items = []  # the final validation's agents would hang too
    t0 = time.monotonic()
    trainer.fit()
    assert time.monotonic() - t0 < 120  # not the hung agents' 300 s deadline
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "actor/pg_loss" in r]
    n, B = cfg.rollout.n, 4 * cfg.rollout.n
    assert len(steps) == len(batches) == 1 and cfg.data.train_batch_size == 4 and set(kinds) == {0, 1, 2}
    r, b = steps[0], batches[0]
    assert r["agent/gateway/runs"] == B  # the two workers' rounds (2 prompts each) summed
    assert len({id(t["gateway"]) for t in b["trajectory"]}) == 2
    assert r["agent/gateway/dropped_raised"] == r["agent/gateway/dropped"] == n * kinds.count(1)
    assert r["agent/gateway/sequences"] == n * (2 * kinds.count(0) + kinds.count(2))
    gid, mask = b["group_ids"], b["response_mask"].bool()
    assert len(b) == B + n * kinds.count(0)  # the B0 x n rows, then the edited runs' first sequences
    heads = gid[:B].view(4, n)  # each prompt's n rows together: its uid, or n dropped runs
    assert all(bool((g == g[0]).all() and g[0] >= 0) or bool((g < 0).all()) for g in heads)
    assert set(gid[B:].tolist()) <= set(heads[heads >= 0].tolist())  # extras join their prompt's group
    voids = gid[gid < 0].tolist()
    assert len(voids) == n * kinds.count(1) == len(set(voids))  # a group of its own each
    # step 1's rows: sampled by v0, the only version published before it; every token stamped with it
    assert b["policy_version"].tolist() == [0] * len(b) and r["rollout/staleness_max"] == 0.0
    assert bool((b["token_versions"][mask] == 0).all())
    lp = b["rollout_log_probs"]  # the captured behaviour log-probs, which truncated IS reads
    assert bool((lp[mask] <= 0).all()) and bool((lp[mask] < 0).any()) and bool((lp[~mask] == 0).all())
    assert "rollout/is_weight_mean" in r and torch.isfinite(torch.tensor(r["actor/pg_loss"]))
