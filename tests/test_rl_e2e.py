"""End-to-end RL runs on a tiny model: PPO and GRPO through the CLI, bit-exact resume, exact
micro-batch accumulation, and bad-input handling."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from reinforge.cli.main import main
from reinforge.config.load import load_config
from reinforge.config.schema import RLConfig
from reinforge.trainers.rl import RLTrainer
from tests.conftest import fit_until_crash, rl_overrides
from tests.grad_check import assert_same_steps, record_steps


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    out = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("preset", ["grpo", "ppo"])
def test_train_end_to_end(preset, tiny_model_dir, arith_data, tmp_path, capsys):
    run = tmp_path / preset
    rc = main(["train", "--config", preset, *rl_overrides(tiny_model_dir, arith_data, str(run),
                                                            **{"trainer.report": True})])
    assert rc == 0
    out = capsys.readouterr().out  # the summary: overall val/ metrics, not the per-source breakdown
    assert "done. " in out and "val/acc_greedy=" in out and "val/pass@2=" in out and "val/arithmetic/" not in out
    assert f"run directory: {run}" in out and f"model: {run / 'hf'}" in out, out
    before, after = _weights(Path(tiny_model_dir)), _weights(run / "hf")
    changed = [k for k in after if k in before and not torch.equal(before[k], after[k])]
    assert changed, "no parameter changed"
    rows = _metrics(run)
    steps = [r for r in rows if r["step"] > 0]
    assert len(steps) == 2
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean", "perf/throughput",
                "timing_s/gen", "val/acc_greedy"):
        assert math.isfinite(steps[-1][key]), key
    if preset == "ppo":
        assert math.isfinite(steps[-1]["critic/vf_loss"]) and "actor/reward_kl_penalty_coeff" in steps[-1]
        assert (run / "checkpoints" / "step_2" / "critic.safetensors").exists()
    else:
        assert "actor/kl_loss" in steps[-1]
    assert (run / "checkpoints" / "step_2" / "COMPLETE").exists()
    assert (run / "config.yaml").exists() and (run / "report" / "index.html").exists()
    assert list((run / "samples").glob("step_*.jsonl"))
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(run / "hf")


def test_resume_is_bit_exact(tiny_model_dir, arith_data, tmp_path):
    """Stop after step 2 (a crash), resume: the final weights equal an uninterrupted run's."""
    extra = {"trainer.total_steps": 3, "trainer.save_every": 1, "trainer.keep_last": 3,
             "trainer.val_every": 2, "trainer.export_hf": False, "actor.ppo_epochs": 2, "actor.mini_batch_size": 8}
    full = load_config(RLConfig, "ppo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path / "a"), **extra))
    trainer = RLTrainer(full)
    trainer.fit()
    # fit() from Python (no CLI) writes the resolved config.
    assert load_config(RLConfig, str(tmp_path / "a" / "config.yaml")).to_dict() == trainer.cfg.to_dict()

    crashed = load_config(RLConfig, "ppo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path / "b"), **extra))
    trainer = RLTrainer(crashed)
    fit_until_crash(trainer, 3)
    # A half-written checkpoint from a crash mid-save must be ignored.
    (tmp_path / "b" / "checkpoints" / ".tmp_step_3_999").mkdir()
    resumed = RLTrainer(load_config(RLConfig, "ppo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path / "b"), **extra)))
    resumed.fit(resume=True)
    for name in ("actor", "critic"):
        a = load_file(str(tmp_path / "a" / "checkpoints" / "step_3" / f"{name}.safetensors"))
        b = load_file(str(tmp_path / "b" / "checkpoints" / "step_3" / f"{name}.safetensors"))
        for k in a:
            assert torch.equal(a[k], b[k]), f"{name}.{k} differs after resume"


def test_micro_batches_accumulate_exactly(tiny_model_dir, arith_data, tmp_path):
    """Two updates (2 epochs over one mini-batch) with micro-batch 16 (= mini-batch) and with
    micro-batch 2 accumulate the same gradient at each optimizer step and log the same grad norm
    and losses. (At the first update the ratio is 1 and GRPO's group-centred advantages make the
    seq-mean pg_loss and the KL loss 0; the second epoch makes both non-zero.) The micro-batch 2
    run steps with the first run's gradients (see tests/grad_check.py), so its second update
    starts from the same weights instead of weights AdamW moved apart on rounding noise; no
    clipping, which would hide a gradient off by a factor."""
    grads, rows = [], []
    for micro in (16, 2):
        cfg = load_config(RLConfig, "grpo", rl_overrides(
            tiny_model_dir, arith_data, str(tmp_path / f"m{micro}"),
            **{"trainer.total_steps": 1, "actor.micro_batch_size": micro, "actor.mini_batch_size": 16,
               "actor.ppo_epochs": 2, "actor.loss_agg_mode": "seq-mean-token-mean", "actor.grad_clip": 0,
               "trainer.val_before_train": False, "data.val_files": "[]", "trainer.export_hf": False}))
        t = RLTrainer(cfg)
        grads.append(record_steps(t.actor.opt, t.actor.params, replay=grads[0] if grads else None))
        t.fit()
        rows.append([r for r in _metrics(tmp_path / f"m{micro}") if r["step"] == 1][0])
    assert len(grads[0]) == 2
    assert_same_steps(grads[0], grads[1])
    assert rows[0]["actor/grad_norm"] > 0 and rows[0]["actor/pg_loss"] != 0 and rows[0]["actor/kl_loss"] != 0
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/kl_loss"):
        a, b = rows[0][key], rows[1][key]
        assert abs(a - b) <= 1e-5 * abs(a), (key, a, b)


def test_bad_inputs_exit_nonzero(tiny_model_dir, arith_data, tmp_path, capsys):
    assert main(["train", "--config", "grpo", *rl_overrides("/no/such/model", arith_data, str(tmp_path))]) == 2
    assert "model.path" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    rc = main(["train", "--config", "grpo", *rl_overrides(tiny_model_dir, arith_data, str(tmp_path),
                                                           **{"data.train_files": f"[{empty}]"})])
    assert rc == 2 and "empty.jsonl" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "", "ground_truth": "1"}) + "\n")
    rc = main(["train", "--config", "grpo", *rl_overrides(tiny_model_dir, arith_data, str(tmp_path),
                                                           **{"data.train_files": f"[{bad}]"})])
    err = capsys.readouterr().err
    assert rc == 2 and "bad.jsonl" in err and "row 0" in err and "prompt" in err


def test_reward_function_errors_are_counted_then_fatal(tiny_model_dir, arith_data, tmp_path, capsys):
    fn = tmp_path / "flaky.py"
    fn.write_text("def reward(prompt, response, ground_truth, **kw):\n    raise ValueError('boom')\n")
    over = rl_overrides(tiny_model_dir, arith_data, str(tmp_path / "r"),
                        **{"reward.functions": f"[{{name: '{fn}:reward'}}]", "reward.max_error_rate": 1.0,
                           "trainer.total_steps": 1, "trainer.val_before_train": False})
    assert main(["train", "--config", "grpo", *over]) == 0
    row = [r for r in _metrics(tmp_path / "r") if r["step"] == 1][0]
    assert row["reward/errors"] > 0
    over = [o for o in over if not o.startswith("reward.max_error_rate")] + ["reward.max_error_rate=0.5"]
    assert main(["train", "--config", "grpo", "--overwrite", *over]) == 2
    assert "boom" in capsys.readouterr().err


def test_nonfinite_loss_is_skipped_then_aborts(tiny_model_dir, arith_data, tmp_path):
    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path),
                                                     **{"trainer.total_steps": 3, "actor.max_nonfinite_steps": 2,
                                                        "trainer.val_before_train": False}))
    t = RLTrainer(cfg)
    t.actor.loss_fn = lambda *a, **k: (torch.full_like(a[0], float("nan")), {})
    before = {k: v.clone() for k, v in t.actor_model.state_dict().items()}
    with pytest.raises(FloatingPointError, match="consecutive updates"):
        t.fit()
    for k, v in t.actor_model.state_dict().items():
        assert torch.equal(v, before[k]), "a non-finite update must not touch the weights"
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_cli_resume_flag_continues_a_run(tiny_model_dir, arith_data, tmp_path):
    """`--resume` is a flag (it must not swallow the override after it); `--resume-from` takes a
    checkpoint folder."""
    run = tmp_path / "r"
    common = rl_overrides(tiny_model_dir, arith_data, str(run), **{"trainer.val_before_train": False,
                                                                  "data.val_files": "[]", "trainer.export_hf": False})
    assert main(["train", "--config", "grpo", *common, "trainer.total_steps=1"]) == 0
    assert main(["train", "--config", "grpo", "--resume", *common, "trainer.total_steps=2"]) == 0
    assert [r["step"] for r in _metrics(run)] == [0, 1, 2]  # the resumed run continues at step 2
    assert (run / "checkpoints" / "step_2" / "COMPLETE").exists()
    step1 = run / "checkpoints" / "step_1"
    assert main(["train", "--config", "grpo", "--resume-from", str(step1), *common, "trainer.total_steps=2",
                 "trainer.keep_last=3"]) == 0
    assert [r["step"] for r in _metrics(run)][-1] == 2


def test_pretrained_critic_exported_when_its_last_step_is_skipped(tiny_model_dir, arith_data, tmp_path):
    """VAPO keeps the critic of step value_pretrain_steps, also when that step had no batch
    (dynamic sampling found no informative group) and returned early."""
    from reinforge.protocol import Batch

    cfg = load_config(RLConfig, "vapo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path), **{
        "algorithm.value_pretrain_steps": 1, "trainer.total_steps": 1, "trainer.val_before_train": False,
        "data.val_files": "[]", "trainer.export_hf": False}))
    trainer = RLTrainer(cfg)

    def nothing_informative():
        return Batch(), {}

    trainer.collect_batch = nothing_informative
    trainer.fit()
    assert [r.get("step/skipped") for r in _metrics(tmp_path) if r["step"] == 1] == [1.0]
    assert (tmp_path / "critic_pretrained" / "config.json").exists()


def test_eval_cli(tiny_model_dir, arith_data, capsys):
    rc = main(["eval", "--model", tiny_model_dir, "--data", arith_data["test"], "--n", "2", "--max-samples", "4",
               "--max-prompt-length", "8", "--max-response-length", "4", "--reward", "arithmetic"])
    assert rc == 0
    metrics = json.loads(capsys.readouterr().out)
    assert 0.0 <= metrics["val/acc_greedy"] <= 1.0 and "val/pass@2" in metrics and "val/pass@4" not in metrics
