"""trainer.backend=ray with rollout.staleness > 0 (distributed/rollout_workers.py): versioned
weight publications (checksum refused when corrupted, transfer timeout), and a run with 1
trainer rank + 1 rollout-worker actor whose rows carry their policy versions within the bound,
whose worker killed mid-run is restarted without changing a bit of the run (deterministic
schedule: the restarted worker regenerates the failed chunk from the same seed and weights);
a worker refuses a corrupted publication, and a late one is abandoned after its timeout; and
partial rollouts on Ray (distributed/partial.py) stamp each token with the weights that sampled
it and repeat bit for bit."""
from __future__ import annotations

import json
import os
import signal
import sys

import pytest
import torch

ray = pytest.importorskip("ray")
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

from reinforge.config.load import load_config  # noqa: E402
from reinforge.config.schema import RLConfig  # noqa: E402
from reinforge.distributed.publication import CorruptPublication, Publication, checksum  # noqa: E402
from reinforge.distributed.transport import ObjectStoreTransport, TransferTimeout  # noqa: E402
from tests.conftest import rl_overrides  # noqa: E402


def _tensors() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"b.weight": torch.randn(3, 4, generator=g), "a.bias": torch.randn(5, generator=g)}


def test_checksum_covers_bytes_names_and_shapes():
    t = _tensors()
    pub = Publication.make(3, t)
    assert pub.verify() is pub and pub.digest == checksum(dict(reversed(list(t.items()))))  # name order fixed
    flipped = {k: v.clone() for k, v in t.items()}
    flipped["b.weight"].view(torch.int32)[1, 2] ^= 1  # one bit of one float
    renamed = {"c.weight" if k == "b.weight" else k: v for k, v in t.items()}
    reshaped = {**t, "b.weight": t["b.weight"].reshape(4, 3)}
    for bad in (flipped, renamed, reshaped):
        with pytest.raises(CorruptPublication, match="v3: checksum"):
            Publication(3, bad, pub.digest).verify()


def _slow():
    import time

    time.sleep(30)


def test_object_store_transport_round_trip_and_timeout(ray_cluster):
    tr = ObjectStoreTransport()
    pub = Publication.make(1, _tensors())
    got = tr.fetch(tr.send(pub), 10.0).verify()
    assert got.version == 1 and all(torch.equal(got.tensors[k], v) for k, v in pub.tensors.items())
    late = ray.remote(_slow).options(num_cpus=0).remote()  # a "publication" that never arrives in time
    with pytest.raises(TransferTimeout, match="weight_sync_timeout_s"):
        tr.fetch([late], 0.2)
    ray.cancel(late, force=True)


def _cfg(tiny_model_dir, arith_data, run, **extra) -> RLConfig:
    base = {"trainer.backend": "ray", "rollout.staleness": 1, "rollout.schedule": "deterministic",
            "trainer.rollout_workers": 1, "trainer.total_steps": 3, "trainer.val_before_train": False,
            "trainer.export_hf": False, "actor.use_kl_loss": False, "rollout.stream_prompts": 2}
    return load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(run), **{**base, **extra}))


def _rows(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if json.loads(x)["step"] > 0]


def test_ray_async_versions_and_a_killed_worker(ray_cluster, tiny_model_dir, arith_data, tmp_path):
    """1 rank + 1 rollout worker, staleness 1 (deterministic): the per-row versions lag by at most
    1; a run whose worker is SIGKILLed during its 3rd chunk restarts it and is bit-identical."""
    from reinforge.distributed.rollout_workers import RayBehaviour
    from reinforge.trainers.rl import RLTrainer

    RLTrainer(_cfg(tiny_model_dir, arith_data, tmp_path / "a")).fit()
    a = _rows(tmp_path / "a")
    assert [r["rollout/staleness_max"] for r in a] == [0, 1, 1]
    assert all(0 <= r["rollout/staleness_mean"] <= 1 for r in a)
    assert a[1]["rollout_corr/logprob_gap_abs_mean"] > 1e-4  # generated one update earlier: off-policy

    calls = {"n": 0}
    original = RayBehaviour.generate

    def killing(self, prompts, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(self.pids()[0], signal.SIGKILL)
        return original(self, prompts, **kw)

    trainer = RLTrainer(_cfg(tiny_model_dir, arith_data, tmp_path / "b"))
    pol = trainer.behaviour_policy
    # a worker refuses a corrupted publication and keeps what it holds
    bad = Publication(5, _tensors(), "0" * 64)
    with pytest.raises(CorruptPublication):
        ray.get(pol.workers[0].load.remote(ObjectStoreTransport().send(bad), 10.0))
    assert ray.get(pol.workers[0].version.remote()) == -1
    # a publication that never arrives: 3 tries of weight_sync_timeout_s each, then (timing, still
    # within the bound) generation goes on with the version held; beyond the bound it fails
    late = ray.remote(_slow).options(num_cpus=0).remote()
    pol.timeout_s, pol.schedule, pol.staleness, pol.version = 0.2, "timing", 2, 0
    pol.load(1, {"__handle__": [late]})
    assert pol.version == 0 and pol.timeouts == 3
    with pytest.raises(TransferTimeout):
        pol.load(2, {"__handle__": [late]})
    ray.cancel(late, force=True)
    pol.timeout_s, pol.schedule, pol.staleness, pol.version, pol.latest = 60.0, "deterministic", 1, -1, None
    RayBehaviour.generate = killing
    try:
        trainer.fit()
    finally:
        RayBehaviour.generate = original
    assert trainer.behaviour_policy.restarts == 1
    b = _rows(tmp_path / "b")
    def det(r):  # everything but the clocks
        return {k: v for k, v in r.items() if not k.startswith(("timing", "perf", "time"))}

    assert [det(r) for r in b] == [det(r) for r in a]


def test_ray_partial_rollouts_stamp_their_versions_and_repeat_exactly(ray_cluster, tiny_model_dir, arith_data,
                                                                      tmp_path):
    """rollout.partial on Ray (1 rank + 1 worker, deterministic, staleness 1): the worker switches
    to v + 1 mid-generation through the publication board; every token's recorded log-prob
    equals a full forward of the published weights it is stamped with (1e-5, fp32), some rows mix
    two versions, and a second run whose worker is SIGKILLed mid-chunk is bit-identical."""
    from transformers import AutoModelForCausalLM

    from reinforge.distributed.rollout_workers import RayBehaviour
    from reinforge.models.forward import response_logprobs
    from reinforge.trainers.rl import RLTrainer

    batches, published, calls = [], {}, {"n": 0, "kill": False}
    generate, snapshot = RayBehaviour.generate, RayBehaviour.snapshot

    def recording(self, prompts, **kw):
        calls["n"] += 1
        if calls["kill"] and calls["n"] == 3:
            os.kill(self.pids()[0], signal.SIGKILL)
        out = generate(self, prompts, **kw)
        batches.append(out)
        return out

    def publishing(self, model, version):
        snap = snapshot(self, model, version)
        published[version] = ray.get(snap["__handle__"][0]).verify().tensors
        return snap

    RayBehaviour.generate, RayBehaviour.snapshot = recording, publishing
    # 2 steps: round 0 finishes with v0 (step 1 waits for it), round 1 switches to v1 mid-chunk
    extra = {"rollout.partial": True, "rollout.temperature": 1.0, "trainer.total_steps": 2}
    try:
        RLTrainer(_cfg(tiny_model_dir, arith_data, tmp_path / "a", **extra)).fit()
        a_batches, a_pub = list(batches), dict(published)
        batches.clear()
        calls.update(n=0, kill=True)
        trainer = RLTrainer(_cfg(tiny_model_dir, arith_data, tmp_path / "b", **extra))
        trainer.fit()
    finally:
        RayBehaviour.generate, RayBehaviour.snapshot = generate, snapshot
    assert trainer.behaviour_policy.restarts == 1
    a, b = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    assert all(r["rollout/staleness_token_mean"] <= r["rollout/staleness_mean"] <= 1 for r in a)
    det = lambda r: {k: v for k, v in r.items() if not k.startswith(("timing", "perf", "time"))}  # noqa: E731
    assert [det(r) for r in b] == [det(r) for r in a]
    assert len(batches) == len(a_batches) and all(
        torch.equal(x[k], y[k]) for x, y in zip(batches, a_batches) for k in ("responses", "token_versions",
                                                                               "rollout_log_probs"))

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).float()
    mixed = 0
    for batch in a_batches:
        tv, mask = batch["token_versions"], batch["response_mask"].bool()
        mixed += int((tv.max(1).values > tv[:, 0]).sum())
        expected = torch.zeros_like(batch["rollout_log_probs"])
        with torch.no_grad():
            for v in tv.unique().tolist():
                params = dict(model.named_parameters())
                for k, w in a_pub[v].items():
                    params[k].copy_(w)
                lp, _ = response_logprobs(model, batch["input_ids"], batch["attention_mask"], tv.shape[1])
                expected = torch.where(tv == v, lp, expected)
        assert torch.allclose(batch["rollout_log_probs"][mask], expected[mask], atol=1e-5, rtol=0)
    assert mixed > 0  # the switch really happened mid-row
