"""Mixture-of-experts policies (issue 38): the tiny MoE architectures, the router hooks
(models/moe.py: record, replay, capture), the load-balancing loss against a loop, exact replay
(the trainer's fp32 log-probs equal the lean rollout's), and GRPO / PPO steps end to end."""
from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import rl_overrides

pytestmark = pytest.mark.usefixtures("one_thread")

FAMILIES = ("qwen3_moe", "qwen2_moe", "mixtral")


@pytest.fixture(scope="module")
def tok():
    from reinforge.tasks import build_char_tokenizer

    return build_char_tokenizer()


def _model(tok, family: str, seed: int = 0, replay: bool = True):
    from reinforge.models.moe import attach_routing
    from reinforge.models.tiny import make_tiny_moe_model

    model = make_tiny_moe_model(tok, family=family, seed=seed, hidden_size=64, expert_size=32)
    return model, attach_routing(model, replay=replay)


def _rollout(model, tok, T: int = 6, n: int = 2, **kw):
    from reinforge.protocol import Batch
    from reinforge.workers.rollout.lean import LeanRollout

    engine = LeanRollout(model, tok, max_prompt_length=8, max_response_length=T, **kw)
    assert engine.lean  # the lean loop drives the MoE decoder layers
    prompts = Batch({"uid": torch.arange(4)}, {"prompt_ids": [tok.encode(s) for s in ("1+2=", "35+7=", "9+9=", "64+27=")]})
    torch.manual_seed(0)
    return engine.generate(prompts, n=n)


def _logprobs(model, batch, T: int):
    from reinforge.models.forward import response_logprobs
    from reinforge.models.moe import routing_of, select_for

    select_for(model, batch)
    try:
        with torch.no_grad():
            return response_logprobs(model, batch["input_ids"], batch["attention_mask"], T)[0]
    finally:
        routing_of(model).clear()


def _without_routes(batch):
    return batch.select([k for k in batch.tensors if k != "routed_experts"])


# ---- the load-balancing loss against a loop -------------------------------------------------------
def test_load_balancing_loss_matches_a_loop():
    from reinforge.algos.moe import load_balancing_loss

    g = torch.Generator().manual_seed(0)
    N, E, k, layers = 7, 5, 2, 3
    logits = [torch.randn(N, E, generator=g, requires_grad=True) for _ in range(layers)]
    experts = [torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(N)]) for _ in range(layers)]
    mask = torch.tensor([1, 1, 0, 1, 1, 1, 0.0])
    loss, m = load_balancing_loss(logits, experts, mask)
    ref, fracs = 0.0, []
    for lg, ex in zip(logits, experts):  # E * sum_e f_e P_e, per layer, over the masked tokens
        f, p = [0.0] * E, [0.0] * E
        for i in range(N):
            if mask[i]:
                probs = torch.softmax(lg[i], -1)
                for e in range(E):
                    p[e] = p[e] + probs[e] / mask.sum()
                for j in range(k):
                    f[int(ex[i, j])] += 1.0 / (mask.sum() * k)
        ref = ref + E * sum(fe * pe for fe, pe in zip(f, p)) / layers
        fracs += [float(x) for x in f]
    torch.testing.assert_close(loss, ref, atol=1e-6, rtol=0)
    g1 = torch.autograd.grad(loss, logits, retain_graph=True)
    g2 = torch.autograd.grad(ref, logits)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert float(m["moe_load_max"]) == pytest.approx(max(fracs)) and float(m["moe_load_min"]) == pytest.approx(min(fracs))
    # balanced routing: aux = 1 whatever the logits' scale
    uniform = [torch.zeros(8, 4)]
    balanced = [torch.tensor([[0, 1], [2, 3]] * 4)]
    assert float(load_balancing_loss(uniform, balanced, torch.ones(8))[0]) == pytest.approx(1.0)


# ---- replay ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_replayed_log_probs_equal_the_rollouts_fp32(tok, family):
    """The lean loop records every row's experts (prompt, each step); the trainer's forward that
    replays them gives the rollout's log-probs at fp32 (1e-5); replaying the router's own choice
    is the router's output bit for bit."""
    from reinforge.models.moe import route_dtype, routing_of

    model, routing = _model(tok, family)
    batch = _rollout(model, tok)
    routes = batch["routed_experts"]  # (B, P+T, layers, k)
    assert routes.shape == (8, 8 + 6, 2, 2) and routes.dtype == route_dtype(8) == torch.uint8
    resp = batch["response_mask"].bool()
    replayed = _logprobs(model, batch, 6)
    torch.testing.assert_close(replayed[resp], batch["rollout_log_probs"][resp], atol=1e-5, rtol=0)
    routing.replay_enabled = False
    assert torch.equal(_logprobs(model, batch, 6), replayed)  # same experts: identical forward
    routing.replay_enabled = True
    # another routing changes the computation: replay is applied, not ignored
    other = _without_routes(batch) | type(batch)({"routed_experts": (routes.long() + 1).remainder(8).to(routes.dtype)})
    assert not torch.allclose(_logprobs(model, other, 6)[resp], replayed[resp], atol=1e-3)
    assert routing_of(model).mode is None  # cleared after use


def test_hf_backend_decodes_moe_without_recording(tok):
    """rollout.backend=hf: generate() decodes the three families (its log-probs are the trainer's
    at 1e-5 fp32) and records no routing (so replay is refused with it before any model loads)."""
    from reinforge.protocol import Batch
    from reinforge.workers.rollout.hf import HFRollout

    for family in FAMILIES:
        model, routing = _model(tok, family)
        prompts = Batch({"uid": torch.arange(2)}, {"prompt_ids": [tok.encode("1+2="), tok.encode("33+4=")]})
        batch = HFRollout(model, tok, max_prompt_length=8, max_response_length=6).generate(prompts, n=2)
        assert "routed_experts" not in batch
        routing.replay_enabled = False
        resp = batch["response_mask"].bool()
        torch.testing.assert_close(_logprobs(model, batch, 6)[resp], batch["rollout_log_probs"][resp], atol=1e-5, rtol=0)


def test_replayed_gate_weights_are_the_routers_probabilities(tok):
    """Gate weights under replay: softmax(router logits) gathered at the replayed experts,
    renormalised where the router renormalises (Qwen3-MoE yes, Qwen2-MoE here no)."""
    from reinforge.models.moe import routers

    for family in ("qwen3_moe", "qwen2_moe"):
        model, routing = _model(tok, family)
        gate = routers(model)[0]
        h = torch.randn(1, 3, 64)
        routes = torch.tensor([[[[0, 5]] * 2, [[7, 1]] * 2, [[255, 255]] * 2]], dtype=torch.uint8)  # (1, 3, 2, 2)
        routing.select("replay", routes)
        logits, w, experts = gate(h)
        routing.clear()
        own = gate(h)[2]
        assert experts.tolist() == [[0, 5], [7, 1], own[2].tolist()]  # unrouted: the router's own
        p = torch.softmax(logits.float(), -1).gather(-1, experts)
        torch.testing.assert_close(w, p / p.sum(-1, keepdim=True) if gate.norm_topk_prob else p)


def test_actor_replays_in_the_old_log_prob_pass_and_the_update(tok, tmp_path):
    """ActorWorker: old log-probs with replay equal the rollout's (fp32); the update runs with the
    router loss on and logs the expert-load metrics; without routed_experts it refuses."""
    from reinforge.config.schema import ActorConfig, ModelConfig
    from reinforge.workers.actor import ActorWorker

    model, _ = _model(tok, "qwen3_moe")
    cfg = ActorConfig(lr=1e-3, router_replay="rollout", router_aux_loss_coef=0.01)
    actor = ActorWorker(model, cfg, ModelConfig(path=str(tmp_path)), total_steps=2, mini_batch_size=8,
                        micro_batch_size=4, loss_norm_const=6, seed=0)
    batch = _rollout(model, tok)
    old = actor.log_probs(batch)
    resp = batch["response_mask"].bool()
    torch.testing.assert_close(old["old_log_probs"][resp], batch["rollout_log_probs"][resp], atol=1e-5, rtol=0)
    before = [p.detach().clone() for p in actor.params]
    g = torch.Generator().manual_seed(1)
    m = actor.update(batch | old | type(batch)({"advantages": torch.randn(resp.shape, generator=g)}))
    assert all(k in m for k in ("actor/moe_aux_loss", "actor/moe_load_max", "actor/moe_load_min"))
    assert 1.0 <= m["actor/moe_aux_loss"] < 8 and 1 / 8 <= m["actor/moe_load_max"] <= 1 / 2
    assert any(not torch.equal(a, b) for a, b in zip(before, actor.params))
    router_grads = [p for n, p in model.named_parameters() if n.endswith("gate.weight")]
    with pytest.raises(RuntimeError, match="no routed_experts"):
        actor.log_probs(_without_routes(batch))
    assert router_grads


def test_partial_rollout_re_prefill_records_the_new_weights_routing(tok):
    """rollout.partial: after a weight switch the loop re-prefills its rows; the routing it records
    for the earlier positions is the new weights', so the replayed fp32 forward under the final
    weights gives every token sampled after the switch its rollout log-prob."""
    from reinforge.protocol import Batch
    from reinforge.workers.rollout.lean import LeanRollout

    model, _ = _model(tok, "qwen3_moe")
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    engine = LeanRollout(model, tok, max_prompt_length=8, max_response_length=6)

    def refresh(t):
        if t == 3:
            model.load_state_dict(new)
            return 1
        return None

    prompts = Batch({"uid": torch.arange(3)}, {"prompt_ids": [tok.encode(s) for s in ("1+2=", "35+7=", "9+9=")]})
    torch.manual_seed(0)
    batch = engine.generate(prompts, n=2, refresh=refresh, version=0)
    after = batch["response_mask"].bool() & (batch["token_versions"] == 1)
    assert after.any()
    lp = _logprobs(model, batch, 6)
    torch.testing.assert_close(lp[after], batch["rollout_log_probs"][after], atol=1e-5, rtol=0)


# ---- architectures and end to end ----------------------------------------------------------------
def test_moe_archs_build_with_the_real_tokenizer(real_vocabs, tmp_path):
    """`reinforge model --arch qwen3-moe-tiny` (shrunk: 1 layer, hidden 64) writes a folder that
    loads as Qwen3-MoE with the real tokenizer; qwen2-moe-tiny's config builds its class with the
    published parameter count (on the meta device)."""
    from transformers import AutoModelForCausalLM

    from reinforge.models.archs import arch_config, arch_tokenizer, save_arch
    from reinforge.models.moe import routers

    save_arch("qwen3-moe-tiny", str(tmp_path / "q3"), layers=1, hidden=64)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "q3"))
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and model.config.vocab_size == 151936
    assert [(r.top_k, r.num_experts, r.norm_topk_prob) for r in routers(model)] == [(2, 8, True)]
    tok = arch_tokenizer("qwen3-moe-tiny")
    assert tok.decode(tok.encode("Hello world")) == "Hello world" and tok.convert_tokens_to_ids("<think>") == 151667
    with torch.device("meta"):
        q2 = AutoModelForCausalLM.from_config(arch_config("qwen2-moe-tiny"))
    assert type(q2).__name__ == "Qwen2MoeForCausalLM" and sum(p.numel() for p in q2.parameters()) == 20_172_416
    assert len(routers(q2)) == 2 and hasattr(q2.model.layers[0].mlp, "shared_expert")


def _train(model_dir, data, run_dir, **extra):
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.rl import RLTrainer

    RLTrainer(load_config(RLConfig, "grpo", rl_overrides(model_dir, data, str(run_dir), **{
        "trainer.val_before_train": False, "trainer.export_hf": False, **extra}))).fit()
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"step": 0' not in x]


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory, tok):
    from reinforge.models.tiny import make_tiny_moe_model

    out = tmp_path_factory.mktemp("tiny_moe")
    make_tiny_moe_model(tok, str(out), family="qwen3_moe", seed=0, hidden_size=64, expert_size=32)
    return str(out)


def test_grpo_with_replay_trains_and_matches_the_rollout(moe_dir, arith_data, tmp_path):
    """GRPO steps with replay and the router loss (KL loss to the reference on) from a bf16
    rollout (so truncated IS runs and logs rollout_corr/*: the fp32 equality is the tests above)."""
    rows = _train(moe_dir, arith_data, tmp_path / "grpo", **{
        "actor.router_replay": "rollout", "actor.router_aux_loss_coef": 0.01, "actor.use_kl_loss": True,
        "actor.ppo_epochs": 2, "rollout.dtype": "bfloat16"})
    assert len(rows) == 2
    for r in rows:
        assert 0 < r["rollout_corr/logprob_gap_max"] < 0.5 and r["actor/moe_aux_loss"] >= 1.0
        assert r["actor/kl_loss"] is not None and r["actor/grad_norm"] > 0


def test_ppo_critic_and_async_partial_rollouts_with_replay(moe_dir, arith_data, tmp_path):
    """The critic (an MoE backbone with a value head) trains beside the actor; asynchronous rollout
    with partial rollouts carries routed_experts (the actor refuses a batch without them)."""
    rows = _train(moe_dir, arith_data, tmp_path / "ppo", **{"algorithm.adv_estimator": "gae",
                                                            "actor.router_replay": "rollout"})
    assert all(r["critic/vf_loss"] is not None for r in rows)
    rows = _train(moe_dir, arith_data, tmp_path / "async", **{
        "actor.router_replay": "rollout", "rollout.staleness": 1, "rollout.partial": True,
        "trainer.total_steps": 3, "actor.use_kl_loss": False})
    assert len(rows) == 3 and rows[-1]["rollout/staleness_max"] == 1


def test_checkpointed_rows_in_flight_keep_their_routing(moe_dir, arith_data, tmp_path):
    """Deterministic asynchronous schedule with partial rollouts: a checkpoint's rows in flight
    hold routed_experts, and a run crashed at step 3 and resumed logs what the uninterrupted run
    logs, value for value."""
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers import async_rollout
    from reinforge.trainers.rl import RLTrainer
    from tests.conftest import fit_until_crash

    extra = {"actor.router_replay": "rollout", "rollout.staleness": 1, "rollout.schedule": "deterministic",
             "rollout.partial": True, "trainer.total_steps": 4, "trainer.save_every": 1, "trainer.keep_last": 4,
             "rollout.stream_prompts": 3, "actor.use_kl_loss": False, "trainer.val_before_train": False,
             "trainer.export_hf": False}

    def cfg(run):
        return load_config(RLConfig, "grpo", rl_overrides(moe_dir, arith_data, str(tmp_path / run), **extra))

    def rows(run):
        return [{k: v for k, v in json.loads(x).items() if not k.startswith(("timing_s/", "perf/")) and k != "time"}
                for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]

    RLTrainer(cfg("full")).fit()
    fit_until_crash(RLTrainer(cfg("part")), 3)
    saved = torch.load(tmp_path / "part" / "checkpoints" / "step_2" / async_rollout.CHUNKS_FILE, weights_only=False)
    assert saved and all(c["tensors"]["routed_experts"].dtype == torch.uint8 for c in saved)
    RLTrainer(cfg("part")).fit(resume=True)
    assert rows("full") == rows("part")


@pytest.mark.slow
def test_demo_moe_quick(tmp_path):
    """`reinforge demo --moe --quick`: the MoE policy through SFT and GRPO with replay, its report
    naming the MoE shape and the expert-load metrics logged."""
    from reinforge.cli.main import main

    out = tmp_path / "demo_moe"
    assert main(["demo", "--moe", "--quick", "--out", str(out)]) == 0
    report = json.loads((out / "demo_report.json").read_text())
    assert report["moe"]["family"] == "qwen3_moe"
    assert json.loads((out / "model" / "config.json").read_text())["model_type"] == "qwen3_moe"
    rows = [json.loads(x) for x in (out / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert all("actor/moe_load_max" in r for r in rows if r["step"] > 0)
