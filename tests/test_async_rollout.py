"""Asynchronous off-policy rollout (rollout.staleness, trainers/async_rollout.py): the producer's
queue on a fake rollout (staleness bound, streamed groups, resume point, stop and errors), then
tiny end-to-end runs (staleness 0 is the synchronous path; versions and IS weights; resume;
no thread left behind)."""
from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pytest
import torch

from reinforge.config.load import ConfigError, load_config
from reinforge.config.schema import RLConfig
from reinforge.trainers.plan import plan_rl
from reinforge.data.loader import PromptLoader
from reinforge.protocol import Batch
from reinforge.rewards.result import RewardResult
from reinforge.trainers import async_rollout
from reinforge.trainers.async_rollout import AsyncProducer, Start
from reinforge.trainers.rl import RLTrainer
from reinforge.workers.rollout.behaviour import LocalBehaviour
from tests.agents.test_agent_e2e import tool_model  # noqa: F401 (the fixture: a model that calls a tool)
from tests.conftest import fit_until_crash, rl_overrides

pytestmark = pytest.mark.usefixtures("one_thread")
THREAD = "reinforge-async-rollout"


class FakeRollout:
    """generate() -> n rows a prompt carrying its group id; `fail_after` calls, then raises."""

    def __init__(self, fail_after: int | None = None, delay: float = 0.0):
        self.model = torch.nn.Linear(1, 1)
        self.calls, self.fail_after, self.delay = 0, fail_after, delay

    def generate(self, prompts: Batch, *, n: int, temperature: float) -> Batch:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise ValueError("generation failed")
        time.sleep(self.delay)
        return Batch({"group_ids": prompts["uid"].repeat_interleave(n)},
                     {"prompt_text": [t for t in prompts["prompt_text"] for _ in range(n)]})


def _items(count: int) -> list[dict]:
    return [{"prompt_ids": [1], "prompt_text": f"p{i}", "ground_truth": str(i)} for i in range(count)]


def _producer(rollout, loader, *, start=None, staleness=1, B=4, chunk=3, n=2, **kw) -> AsyncProducer:
    start = start or Start(loader.state_dict(), 0, 0)
    return AsyncProducer(LocalBehaviour(rollout, seed=0, copy_model=False), loader, start, version=0, n=n,
                         temperature=1.0, staleness=staleness, batch_prompts=B, chunk_prompts=chunk, seed=0, **kw)


def _take_groups(p: AsyncProducer, groups: int, pieces: list[int]) -> Batch:
    """`groups` groups in takes of the sizes in `pieces` (cycled), as dynamic sampling would."""
    parts, got, i = [], 0, 0
    while got < groups:
        rows, _, _ = p.take(min(pieces[i % len(pieces)], groups - got))
        parts.append(rows)
        got, i = got + len(rows) // p.n, i + 1
    return Batch.concat(parts)


@pytest.mark.parametrize("staleness", [1, 2])
def test_versions_lag_by_at_most_k_and_groups_stay_whole(staleness):
    loader = PromptLoader(_items(10), batch_size=4, seed=0)
    p = _producer(FakeRollout(), loader, staleness=staleness)
    model, rng, seen = torch.nn.Linear(1, 1), random.Random(0), []
    try:
        for step in range(1, 9):
            batch = _take_groups(p, 4, [rng.randint(1, 4)])
            lag = (step - 1) - batch["policy_version"]
            assert 0 <= int(lag.min()) and int(lag.max()) <= staleness, (step, batch["policy_version"])
            gids = batch["group_ids"].view(-1, 2)
            assert torch.equal(gids[:, 0], gids[:, 1])  # n rows per group, never split
            seen += gids[:, 0].tolist()
            time.sleep(0.01)  # the "update": the producer fills the queue meanwhile
            p.publish(model, step)
        assert seen == list(range(32)), "every prompt once, in order"
        assert p.pending <= staleness * 4
    finally:
        p.stop()
    assert not p.thread.is_alive()


def test_resume_point_continues_with_the_first_untaken_prompt():
    items = _items(10)
    loader = PromptLoader(items, batch_size=4, seed=0)
    p = _producer(FakeRollout(), loader, staleness=2)
    try:
        _take_groups(p, 6, [3, 1, 2])  # ends inside a chunk of the second round
        start = p.resume_point()
        expected = _take_groups(p, 5, [5])["prompt_text"]
    finally:
        p.stop()
    assert (start.offset, start.uid) == (2, 6)
    fresh = PromptLoader(items, batch_size=4, seed=0)
    fresh.load_state_dict(start.loader_state)
    q = _producer(FakeRollout(), fresh, start=start, staleness=2)
    try:
        again = _take_groups(q, 5, [5])
    finally:
        q.stop()
    assert again["prompt_text"] == expected and again["group_ids"][0] == 6


def _scored(scores: torch.Tensor, metrics: dict) -> RewardResult:
    """A RewardWorker.score result with these sequence scores."""
    return RewardResult(scores, scores[:, None], scores > 0.5, [""] * len(scores), metrics=metrics)


def test_dynamic_sampling_takes_only_the_missing_groups():
    """Groups with an even uid score alike (uninformative): each step keeps the next 4 odd ones,
    taking the missing count each round, so the following step starts right after them."""
    from reinforge.trainers.logging import Timer

    def score(rows: Batch):
        g = rows["group_ids"]
        varied = torch.arange(len(g)) % 2 * (g % 2)  # odd groups: 0, 1 within each pair of rows
        return _scored(varied.float(), {"reward/mean": 0.0})

    p = _producer(FakeRollout(), PromptLoader(_items(64), batch_size=4, seed=0), staleness=2)
    try:
        kw = dict(want=4, dynamic=True, max_rounds=3)
        batch, m, _ = async_rollout.collect(p, score, Timer(), **kw)
        assert batch["group_ids"].view(-1, 2)[:, 0].tolist() == [1, 3, 5, 7]
        assert m["dynamic_sampling/batch_fill"] == 1.0 and m["dynamic_sampling/kept_ratio"] == 0.5
        # takes of the missing count, each ending at a chunk's end (chunks of 3 in rounds of 4):
        # groups 0-2, 3, 4-5, 6, 7
        assert m["dynamic_sampling/gen_rounds"] == 5
        batch, _, _ = async_rollout.collect(p, score, Timer(), **kw)
        assert batch["group_ids"].view(-1, 2)[:, 0].tolist() == [9, 11, 13, 15]
        # the budget: at most max_rounds x want groups seen, then what was kept
        batch, m, _ = async_rollout.collect(p, lambda rows: _scored(torch.zeros(len(rows)), {}), Timer(), **kw)
        assert len(batch) == 0 and m["dynamic_sampling/kept_ratio"] == 0.0
        assert p.resume_point().uid == 16 + 12
    finally:
        p.stop()


def test_producer_error_reaches_the_trainer_and_stop_is_clean():
    loader = PromptLoader(_items(8), batch_size=4, seed=0)
    p = _producer(FakeRollout(fail_after=1), loader)
    try:
        p.take(3)
        with pytest.raises(RuntimeError, match="producer failed") as info:
            p.take(4)
            p.take(4)
        assert isinstance(info.value.__cause__, ValueError)
    finally:
        p.stop()
    slow = _producer(FakeRollout(delay=0.2), PromptLoader(_items(8), batch_size=4, seed=0))
    slow.stop()  # while a chunk is generating: returns once it is done
    assert not slow.thread.is_alive()


def test_on_policy_update_weights_like_the_old_log_prob_pass(tiny_model_dir):
    """Truncated IS computed from the update's own forward (no old-log-prob pass) takes the same
    step and reports the same means as weights from the separate pass (2 micro-batches)."""
    from tests.grad_check import assert_same_steps, record_steps
    from tests.test_onpolicy import _actor, _batch

    with_pass, without = _actor(tiny_model_dir, tis_cap=2.0), _actor(tiny_model_dir, on_policy=True, tis_cap=2.0)
    batch = _batch(with_pass.model.config.vocab_size)
    old = with_pass.log_probs(batch)
    noise = torch.randn(batch["response_mask"].shape, generator=torch.Generator().manual_seed(1))
    batch = batch | Batch({"rollout_log_probs": (old["old_log_probs"] + noise) * batch["response_mask"]})
    ga = record_steps(with_pass.opt, with_pass.params)
    gb = record_steps(without.opt, without.params, replay=ga)
    ma, mb = with_pass.update(batch | old), without.update(batch)
    assert_same_steps(ga, gb)
    assert 0 < mb["rollout_corr/tis_clip_frac"] < 1  # some weights capped, some not
    for k in ("rollout_corr/tis_weight_mean", "rollout_corr/tis_clip_frac", "rollout_corr/logprob_gap_abs_mean",
              "actor/pg_loss"):
        assert mb[k] == pytest.approx(ma[k], abs=1e-5), k


# ---- end to end on the tiny model -------------------------------------------------------------

def _cfg(tiny_model_dir, arith_data, run_dir, **extra) -> RLConfig:
    return load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(run_dir), **{
        "actor.use_kl_loss": False, "trainer.val_before_train": False, "trainer.export_hf": False, **extra}))


def _rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["step"] > 0]


def _no_producer_thread() -> bool:
    return not any(t.name == THREAD for t in threading.enumerate())


def test_staleness_0_runs_the_synchronous_path(tiny_model_dir, arith_data, tmp_path, monkeypatch):
    def refuse(trainer):
        raise AssertionError("staleness 0 started a producer")

    monkeypatch.setattr(async_rollout, "start_producer", refuse)
    trainer = RLTrainer(_cfg(tiny_model_dir, arith_data, tmp_path / "s0", **{"rollout.staleness": 0}))
    trainer.fit()
    assert trainer.producer is None
    rows = _rows(tmp_path / "s0")
    assert len(rows) == 2 and not any(k.startswith("rollout/") for r in rows for k in r)
    assert "timing_s/old_log_prob" not in rows[-1]  # on-policy: no old-log-prob pass, no IS


def test_staleness_1_versions_and_is_weights(tiny_model_dir, arith_data, tmp_path):
    run = tmp_path / "s1"
    RLTrainer(_cfg(tiny_model_dir, arith_data, run, **{"rollout.staleness": 1, "trainer.total_steps": 4,
                                                       "rollout.stream_prompts": 3})).fit()
    rows = _rows(run)
    assert [r["rollout/staleness_max"] for r in rows] == [0, 1, 1, 1]
    # step 1 was generated by the weights it trains: the behaviour log-probs are the policy's
    assert rows[0]["rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert rows[0]["rollout_corr/logprob_gap_abs_mean"] < 1e-5
    # later steps were generated one update earlier (lr 1e-3): the weights differ from 1
    assert all(r["rollout_corr/logprob_gap_abs_mean"] > 1e-3 for r in rows[1:])
    assert "timing_s/old_log_prob" not in rows[-1]  # on-policy: the update's own pass weights
    assert all(0 <= r["rollout/is_weight_clipped_frac"] <= 1 for r in rows)
    # lr 0: the behaviour copy always equals the policy, so every weight is 1 however stale
    still = tmp_path / "lr0"
    RLTrainer(_cfg(tiny_model_dir, arith_data, still, **{"rollout.staleness": 1, "trainer.total_steps": 3,
                                                         "actor.lr": 0.0})).fit()
    rows = _rows(still)
    assert rows[-1]["rollout/staleness_max"] == 1
    assert all(r["rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-4) for r in rows)
    assert _no_producer_thread()


def test_resume_with_staleness_continues_the_prompts(tiny_model_dir, arith_data, tmp_path):
    def groups(run: Path, step: int) -> set[int]:
        lines = (run / "samples" / f"train_step_{step}.jsonl").read_text().splitlines()
        return {json.loads(x)["group"] for x in lines}

    extra = {"rollout.staleness": 1, "trainer.total_steps": 3, "trainer.save_every": 1, "trainer.log_samples_every": 1}
    full = tmp_path / "full"
    RLTrainer(_cfg(tiny_model_dir, arith_data, full, **extra)).fit()
    part = tmp_path / "part"
    RLTrainer(_cfg(tiny_model_dir, arith_data, part, **{**extra, "trainer.total_steps": 1})).fit()
    resumed = RLTrainer(_cfg(tiny_model_dir, arith_data, part, **extra))
    resumed.fit(resume=True)
    assert [groups(part, s) for s in (2, 3)] == [groups(full, s) for s in (2, 3)]
    rows = _rows(part)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[1]["rollout/staleness_max"] == 0  # restarted fresh
    assert _no_producer_thread()


def test_partial_rollouts_with_the_timing_schedule(tiny_model_dir, arith_data, tmp_path):
    """rollout.partial with the timing schedule: rows switch to new weights as they arrive; the
    per-token lag never exceeds the per-row one, and both stay within the bound."""
    run = tmp_path / "partial"
    RLTrainer(_cfg(tiny_model_dir, arith_data, run, **{"rollout.staleness": 1, "trainer.total_steps": 3,
                                                       "rollout.partial": True})).fit()
    rows = _rows(run)
    assert all(r["rollout/staleness_token_max"] <= r["rollout/staleness_max"] <= 1 for r in rows)
    assert all(r["rollout/staleness_token_mean"] <= r["rollout/staleness_mean"] for r in rows)
    assert _no_producer_thread()


def test_an_exception_in_the_trainer_stops_the_producer(tiny_model_dir, arith_data, tmp_path):
    trainer = RLTrainer(_cfg(tiny_model_dir, arith_data, tmp_path / "boom", **{"rollout.staleness": 1}))

    def boom(batch):
        raise KeyError("update failed")

    trainer.actor.update = boom
    with pytest.raises(KeyError, match="update failed"):
        trainer.fit()
    assert _no_producer_thread()


@pytest.mark.parametrize("override, match", [("rollout.backend=hf", "needs rollout.backend=lean"),
                                             ("rollout.schedule=sometimes", "rollout.schedule"),
                                             ("rollout.max_turns=2", "rollout.partial=true runs single-turn"),
                                             ("rollout.dtype=bfloat16", "rollout.partial=true swaps")])
def test_staleness_refuses_what_it_cannot_drive(tiny_model_dir, arith_data, tmp_path, override, match):
    key, value = override.split("=")
    partial = {"rollout.partial": True} if "partial" in match else {}
    with pytest.raises(ConfigError, match=match):
        plan_rl(_cfg(tiny_model_dir, arith_data, tmp_path / "bad", **{"rollout.staleness": 1, key: value, **partial}))



def test_multi_turn_episodes_stream_through_the_producer(tool_model, tmp_path):
    """rollout.max_turns > 1: the producer drives a copy of the agent loop (tools run in its thread)."""
    from tests.agents.test_agent_e2e import _cfg as agent_cfg, _data

    run = tmp_path / "agent"
    RLTrainer(agent_cfg(tool_model, _data(tmp_path), str(run), **{"rollout.staleness": 1})).fit()
    rows = _rows(run)
    assert [r["rollout/staleness_max"] for r in rows] == [0, 1]
    assert all(r["agent/tool_calls_mean"] > 0.5 and r["agent/turns_mean"] > 1.5 for r in rows)
    assert rows[0]["rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert _no_producer_thread()


# ---- the deterministic schedule --------------------------------------------------------------

def test_deterministic_versions_follow_the_schedule_not_timing():
    """Round r (4 prompts, chunks of 3 + 1) is generated by version max(0, r - k) whatever the
    trainer's speed, and each chunk from its own seed: a slow and a fast trainer see the same."""
    from reinforge.trainers.async_schedule import chunk_seed, chunk_version

    assert [chunk_version(u, 4, 2) for u in (0, 4, 8, 11, 12)] == [0, 0, 0, 0, 1]
    assert chunk_seed(0, 0) != chunk_seed(0, 3) != chunk_seed(1, 0)
    got = []
    for delay in (0.0, 0.03):
        p = _producer(FakeRollout(), PromptLoader(_items(12), batch_size=4, seed=0), staleness=2,
                      schedule="deterministic")
        model, versions = torch.nn.Linear(1, 1), []
        try:
            for step in range(1, 7):
                versions.append(_take_groups(p, 4, [4])["policy_version"].tolist())
                time.sleep(delay)
                p.publish(model, step)
        finally:
            p.stop()
        got.append(versions)
    assert got[0] == got[1] == [[max(0, r - 2)] * 8 for r in range(6)]


def _exact_rows(run: Path) -> list[dict]:
    """metrics.jsonl without what depends on time."""
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/")) and k != "time"}
            for r in _rows(run)]


@pytest.mark.parametrize("staleness, dynamic, partial", [(1, False, False), (2, True, False), (1, False, True)])
def test_deterministic_schedule_resumes_bit_exactly(tiny_model_dir, arith_data, tmp_path, staleness, dynamic,
                                                    partial):
    """A run crashed at step 3 (its checkpoint at step 2 holds rows in flight) and resumed equals
    the uninterrupted run: every logged value and the final weights, bit for bit; with partial
    rollouts too (the switch to newer weights at a fixed position: tokens newer than rows)."""
    from safetensors.torch import load_file

    extra = {"rollout.staleness": staleness, "rollout.schedule": "deterministic", "trainer.total_steps": 4,
             "trainer.save_every": 1, "trainer.keep_last": 4, "rollout.stream_prompts": 3,
             "algorithm.dynamic_sampling": dynamic, "algorithm.max_gen_rounds": 2, "rollout.partial": partial}
    full = tmp_path / "full"
    RLTrainer(_cfg(tiny_model_dir, arith_data, full, **extra)).fit()
    part = tmp_path / "part"
    trainer = RLTrainer(_cfg(tiny_model_dir, arith_data, part, **extra))
    fit_until_crash(trainer, 3)
    assert (part / "checkpoints" / "step_2" / async_rollout.CHUNKS_FILE).is_file()
    RLTrainer(_cfg(tiny_model_dir, arith_data, part, **extra)).fit(resume=True)
    a, b = _exact_rows(full), _exact_rows(part)
    assert [r["step"] for r in b] == [1, 2, 3, 4] and a == b
    assert max(r["rollout/staleness_max"] for r in a) == staleness
    # the rows in flight the checkpoint saved: only partial rollouts mix versions within a row
    saved = torch.load(part / "checkpoints" / "step_2" / async_rollout.CHUNKS_FILE, weights_only=False)
    assert saved and sum(len(c["tensors"]["group_ids"]) for c in saved) > 0
    mixed = [bool((c["tensors"]["token_versions"] != c["tensors"]["policy_version"][:, None])
                  [c["tensors"]["response_mask"].bool()].any()) for c in saved]
    assert any(mixed) == partial
    wa = load_file(str(full / "checkpoints" / "step_4" / "actor.safetensors"))
    wb = load_file(str(part / "checkpoints" / "step_4" / "actor.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert _no_producer_thread()


# ---- partial rollouts ------------------------------------------------------------------------


def switching_policy(engine, base: dict, **kw):
    """A LocalBehaviour on `engine` at version 0 (`base`, the trainable weights), two noisier
    versions of them, and a refresh that switches to version 1 at response position 2 and to
    version 2 at position 4 -> (policy, the three weight dicts, refresh)."""
    g = torch.Generator().manual_seed(0)
    weights = [base] + [{k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in base.items()} for _ in range(2)]
    policy = LocalBehaviour(engine, seed=0, **kw)
    assert policy.partial_ok
    policy.load(0, None)

    def refresh(t: int):
        if t in (2, 4):
            policy.load(t // 2, weights[t // 2])
            return t // 2
        return None

    return policy, weights, refresh


def test_partial_rollout_tokens_are_sampled_by_their_stamped_version(tiny_model_dir):
    """Weights swapped at positions 2 and 4 (versions 0 -> 1 -> 2): each token's recorded log-prob
    equals a full forward of the weights its token_versions names (1e-5, fp32), and a row that
    saw a switch differs from what the old weights give (the switch really took effect)."""
    from transformers import AutoModelForCausalLM

    from reinforge.models.forward import response_logprobs
    from reinforge.tasks import build_char_tokenizer
    from reinforge.workers.rollout.lean import LeanRollout

    tok = build_char_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).float()
    base = {k: p.detach().clone() for k, p in model.named_parameters()}
    engine = LeanRollout(model, tok, max_prompt_length=8, max_response_length=6)
    policy, weights, refresh = switching_policy(engine, base, copy_model=False)

    prompts = Batch({"uid": torch.arange(3)}, {"prompt_ids": [tok.encode(s) for s in ("1+2=", "33+4=", "7=")]})
    batch = policy.generate(prompts, n=2, temperature=1.0, seed=5, refresh=refresh)
    tv, mask = batch["token_versions"], batch["response_mask"].bool()
    assert tv.shape == batch["responses"].shape and torch.equal(batch["policy_version"], tv[:, 0])
    assert set(tv[mask].tolist()) == {0, 1, 2}
    with torch.no_grad():
        per_version = []
        for w in weights:
            for k, p in model.named_parameters():
                p.copy_(w[k])
            lp, _ = response_logprobs(model, batch["input_ids"], batch["attention_mask"], tv.shape[1])
            per_version.append(lp)
    expected = torch.stack(per_version).gather(0, tv[None])[0]
    assert torch.allclose(batch["rollout_log_probs"][mask], expected[mask], atol=1e-5, rtol=0)
    later = mask & (tv > 0)
    assert (batch["rollout_log_probs"][later] - per_version[0][later]).abs().max() > 1e-3
