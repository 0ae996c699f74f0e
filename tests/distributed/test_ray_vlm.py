"""trainer.backend=ray on image prompts (2 CPU ranks, gloo, FSDP2; a tiny Qwen2-VL): the rows carry
their PromptImages to the ranks, whose actor, reference and VLM critic give the log-probs, values
and update gradients of one local process; a GRPO run generates on the ranks with the images, trains
the language model with the tower frozen and exports a VLM folder with its image processor."""
from __future__ import annotations

import json
import math

import pytest
import torch
from PIL import Image

ray = pytest.importorskip("ray")

from reinforge.config.load import load_config  # noqa: E402
from reinforge.config.schema import RLConfig  # noqa: E402
from reinforge.protocol import Batch  # noqa: E402
from reinforge.seeding import seed_everything  # noqa: E402
from reinforge.trainers.plan import plan_rl  # noqa: E402
from tests.conftest import rl_overrides  # noqa: E402
from tests.distributed.test_ray_group import assert_ranks_match_one_process  # noqa: E402



@pytest.fixture(scope="module")
def vlm_files(tmp_path_factory):
    from reinforge.models.vlm_tiny import make_tiny_vlm
    from reinforge.tasks import make_task_data

    root = tmp_path_factory.mktemp("ray_vlm")
    make_tiny_vlm(str(root / "model"), hidden_size=64, num_layers=2)
    files = make_task_data("count_shapes", str(root / "shapes"), n_train=8, n_test=2, n_sft=2, seed=0)
    return str(root / "model"), {"train": files["train"], "test": files["test"]}


def _overrides(model, data, run_dir, **extra):
    base = {"data.max_prompt_length": 64, "rollout.max_response_length": 3, "data.val_files": "[]",
            "trainer.val_before_train": False}
    return rl_overrides(model, data, run_dir, **{**base, **extra})


def _image_batch(model_dir: str) -> Batch:
    """8 rows: 4 image prompts (two image sizes, left-padded) x 2 samples sharing their prompt's
    PromptImages, ragged random responses, advantages and returns."""
    from reinforge.models.loading import load_vlm_processor
    from reinforge.models.padding import pad
    from reinforge.models.vlm_inputs import encode_prompt

    proc = load_vlm_processor(model_dir)
    g = torch.Generator().manual_seed(0)
    ids, vision, resp = [], [], []
    for i, (size, text) in enumerate([(56, "How many?"), (84, "Count the red shapes."), (56, "x"), (84, "y y")]):
        msg = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
        p, v = encode_prompt(proc, msg, [Image.new("RGB", (size, size), (50 * i, 200, 30))])
        for k in range(2):
            ids.append(p)
            vision.append(v)
            resp.append(torch.randint(9, 100, (2 + (i + k) % 3,), generator=g).tolist())
    p_ids, p_mask = pad(ids, proc.tokenizer.pad_token_id, side="left")
    r_ids, r_mask = pad(resp, proc.tokenizer.pad_token_id, side="right", length=4)
    B, T = r_ids.shape
    return Batch({"input_ids": torch.cat([p_ids, r_ids], 1), "attention_mask": torch.cat([p_mask, r_mask], 1),
                  "responses": r_ids, "response_mask": r_mask, "advantages": torch.randn(B, T, generator=g),
                  "returns": torch.randn(B, T, generator=g)}, {"vision": vision})


def test_two_ranks_equal_one_process_on_image_prompts(ray_cluster, vlm_files, tmp_path):
    """PPO's passes on image rows: the actor's and the reference's log-probs, the VLM critic's
    values, the gradient of every optimizer step of both updates and the weights after them agree
    between 2 ranks and 1 process (1e-5); both towers stay as they were; the ranks' critic export
    (VAPO's critic_pretrained) is a VLM critic folder that loads back with the trained head."""
    from reinforge.models.loading import load_critic, load_tokenizer
    from reinforge.trainers.rl_setup import build_ray_workers, build_workers

    model, data = vlm_files
    base = {"actor.mini_batch_size": 4, "critic.mini_batch_size": 4, "actor.micro_batch_size": 2,
            "critic.micro_batch_size": 2, "actor.lr": 1e-3, "critic.lr": 1e-3}

    def plan(run, **extra):
        return plan_rl(load_config(RLConfig, "ppo", _overrides(model, data, str(tmp_path / run), **base, **extra)))

    local_plan = plan("l")
    seed_everything(local_plan.cfg.trainer.seed)
    local = build_workers(local_plan)
    remote, group = build_ray_workers(plan("r", **{"trainer.backend": "ray", "trainer.devices_per_node": 2}))
    try:
        batch = _image_batch(model)
        states = assert_ranks_match_one_process(local, remote, group, batch)
        for role, full in states.items():
            local_state = getattr(local, f"{role}_model").state_dict()
            init = {k: v for k, v in local_state.items() if "visual" in k}
            assert init and all(torch.equal(full[k], v) for k, v in init.items() if k in full)
            if role == "critic":
                (tmp_path / "critic_hf").mkdir()  # write_export's temporary folder, in a run
                remote.critic.export(tmp_path / "critic_hf", load_tokenizer(model))
                back = load_critic(str(tmp_path / "critic_hf"), dtype="float32").state_dict()
                assert back.keys() == full.keys() and all(torch.equal(back[k], v) for k, v in full.items())
    finally:
        group.shutdown()


def test_grpo_on_image_prompts_with_two_ranks(ray_cluster, vlm_files, tmp_path):
    """One GRPO step through RLTrainer: the ranks generate with the images (old log-probs equal
    the rollout's), the language model trains with the tower frozen, rank 0's export loads back
    as a VLM with its image processor, the logged samples show their pictures, validation
    generates on the ranks from image prompts, and a second
    trainer resumes from the ranks' shards (frozen tower in the root unit) to step 2."""
    from safetensors.torch import load_file

    from reinforge.models.loading import load_causal_lm, load_vlm_processor
    from reinforge.trainers.rl import RLTrainer

    model, data = vlm_files
    run = tmp_path / "run"
    extra = {"trainer.backend": "ray", "trainer.devices_per_node": 2, "trainer.total_steps": 1, "rollout.n": 2,
             "data.train_batch_size": 2, "actor.mini_batch_size": 2, "actor.micro_batch_size": 2,
             "trainer.save_every": 1, "trainer.log_samples_every": 1, "data.val_files": f"[{data['test']}]",
             "trainer.val_before_train": True}

    def cfg(steps: int) -> RLConfig:
        return load_config(RLConfig, "grpo", _overrides(model, data, str(run), **{**extra, "trainer.total_steps": steps}))

    trainer = RLTrainer(cfg(1))
    seen, log_probs = [], trainer.actor.log_probs

    def record(batch, **kw):
        seen.append((batch, log_probs(batch, **kw)))
        return seen[-1][1]

    trainer.actor.log_probs = record
    last = trainer.fit()
    assert math.isfinite(last["actor/pg_loss"]) and last["actor/grad_norm"] > 0
    assert 0.0 <= last["val/acc_greedy"] <= 1.0  # validation on image prompts, generated on the ranks
    batch, old = seen[0]
    assert all(v is not None for v in batch["vision"])
    mask = batch["response_mask"].bool()
    assert torch.allclose(old["old_log_probs"][mask], batch["rollout_log_probs"][mask], atol=1e-4)
    base = load_causal_lm(model, train=False).state_dict()
    step = load_file(str(run / "checkpoints" / "step_1" / "actor.safetensors"))
    assert all(torch.equal(step[k], base[k]) for k in step if "visual" in k)
    assert any(not torch.equal(step[k], base[k]) for k in step if "language_model" in k)
    exported = load_causal_lm(str(run / "hf"), train=False)
    assert hasattr(exported.model, "visual") and load_vlm_processor(str(run / "hf")).image_processor is not None
    assert all(torch.equal(exported.state_dict()[k], v) for k, v in step.items() if k in exported.state_dict())
    rows = [json.loads(x) for x in (run / "samples" / "train_step_1.jsonl").read_text().splitlines()]
    assert any(r.get("images") for r in rows)
    resumed = RLTrainer(cfg(2))
    resumed.fit(resume=True)
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 2 and steps.count(1) == 1
    step2 = load_file(str(run / "checkpoints" / "step_2" / "actor.safetensors"))
    assert all(torch.equal(step2[k], base[k]) for k in step2 if "visual" in k)


def test_ray_rollout_workers_partial_rollouts_on_image_prompts(ray_cluster, vlm_files, tmp_path):
    """1 rank + 1 rollout worker, staleness 1 (deterministic), partial rollouts: the worker's rows
    carry their prompts' images (pickled PromptImages), rows switch weights mid-response, and the
    per-token lag stays within the per-row one."""
    from reinforge.trainers.rl import RLTrainer

    model, data = vlm_files
    run = tmp_path / "async"
    extra = {"trainer.backend": "ray", "rollout.staleness": 1, "rollout.schedule": "deterministic",
             "rollout.partial": True, "trainer.rollout_workers": 1, "trainer.total_steps": 3,
             "trainer.export_hf": False, "rollout.stream_prompts": 2, "data.train_batch_size": 4, "rollout.n": 2,
             "rollout.max_response_length": 6, "actor.mini_batch_size": 8, "actor.micro_batch_size": 4}
    trainer = RLTrainer(load_config(RLConfig, "grpo", _overrides(model, data, str(run), **extra)))
    seen, update = [], trainer.actor.update

    def record(batch):
        seen.append(batch)
        return update(batch)

    trainer.actor.update = record
    trainer.fit()
    assert len(seen) == 3
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if json.loads(x)["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2, 3] and all(math.isfinite(r["actor/pg_loss"]) for r in rows)
    assert all(r["rollout/staleness_token_max"] <= r["rollout/staleness_max"] <= 1 for r in rows)
    assert all(v is not None for b in seen for v in b["vision"])
    assert any(bool((b["token_versions"] != b["policy_version"][:, None])[b["response_mask"].bool()].any())
               for b in seen)
