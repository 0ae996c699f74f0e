"""SFT trainer: the loss goes down, the loss covers response tokens only, packing and micro-batching
change nothing mathematically, resume equals an uninterrupted run, the export loads."""
from __future__ import annotations

import json

import pytest
import torch

from reinforge.config.load import load_config
from reinforge.config.sft import SFTConfig
from reinforge.models.forward import target_logprobs
from reinforge.trainers.sft import SFTTrainer, collate_rows, pack_examples
from tests.grad_check import assert_same_steps, record_steps


def _cfg(model_dir, data, run_dir, **extra) -> SFTConfig:
    base = {"model.path": model_dir, "data.train_files": f"[{data['sft']}]", "data.max_length": 16,
            "data.batch_size": 16, "optim.micro_batch_size": 16, "optim.lr": 3e-3, "trainer.total_steps": 6,
            "trainer.run_dir": str(run_dir), "trainer.loggers": "[jsonl]", "trainer.progress": False,
            "optim.lr_schedule": "cosine", "optim.warmup_steps": 2}
    base.update(extra)
    return load_config(SFTConfig, "sft", [f"{k}={v}" for k, v in base.items()])


def _weights(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_sft_lowers_loss_and_exports(tiny_model_dir, arith_data, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = _cfg(tiny_model_dir, arith_data, tmp_path, **{
        "trainer.total_steps": 40, "data.val_files": f"[{arith_data['sft']}]", "trainer.val_before_train": True,
        "eval.prompt_files": f"[{arith_data['test']}]", "eval.reward_functions": "[{name: arithmetic}]",
        "eval.max_prompt_length": 8, "eval.max_response_length": 4, "eval.n": 2, "eval.pass_k": "[1,2]"})
    final = SFTTrainer(cfg).fit()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 0 and final["val/loss"] < 0.7 * rows[0]["val/loss"], (rows[0]["val/loss"], final)
    assert rows[-1]["train/loss"] < rows[1]["train/loss"]
    assert 0.0 <= final["val/acc_greedy"] <= 1.0 and "val/pass@2" in final
    assert (tmp_path / "checkpoints" / "step_40" / "COMPLETE").exists()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    for k, v in model.state_dict().items():
        assert torch.isfinite(v).all(), k


def test_loss_covers_response_tokens_only(tiny_model_dir, arith_data, tmp_path):
    trainer = SFTTrainer(_cfg(tiny_model_dir, arith_data, tmp_path))
    items = trainer.train_rows[:5]
    for it in items:  # prompt "a+b=" is masked; the answer digits and the EOS are targets
        n_prompt = it["loss_mask"].index(1)
        assert trainer.tok.decode(it["input_ids"][:n_prompt]).endswith("=")
        assert it["input_ids"][-1] == trainer.tok.eos_token_id and it["loss_mask"][-1] == 1
    batch = collate_rows(items, trainer.tok.pad_token_id)
    logp = target_logprobs(trainer.model, batch)
    # Reference: full logits, every next-token log-prob, masked by loss_mask[:, 1:] by hand.
    logits = trainer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    full = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    want = [full[b, t] for b, it in enumerate(items) for t in range(len(it["input_ids"]) - 1) if it["loss_mask"][t + 1]]
    assert logp.shape[0] == sum(sum(it["loss_mask"]) for it in items)
    torch.testing.assert_close(logp, torch.stack(want), rtol=1e-4, atol=1e-5)
    # A different answer gives different log-probs: the targets are the response tokens.
    other = [dict(it, input_ids=it["input_ids"][:-2] + [it["input_ids"][-2] ^ 1, it["input_ids"][-1]]) for it in items]
    assert not torch.allclose(target_logprobs(trainer.model, collate_rows(other, 0)), logp)


def test_packing_matches_unpacked(tiny_model_dir, arith_data, tmp_path):
    trainer = SFTTrainer(_cfg(tiny_model_dir, arith_data, tmp_path))
    items = trainer.train_rows[:12]
    packed = pack_examples(items, 32)
    assert len(packed) < len(items) and max(len(r["input_ids"]) for r in packed) <= 32
    assert all(r["position_ids"][0] == 0 for r in packed)
    a = target_logprobs(trainer.model, collate_rows(items, 0))
    b = target_logprobs(trainer.model, collate_rows(packed, 0))
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # attention never crosses examples


def test_micro_batches_accumulate_exactly(tiny_model_dir, arith_data, tmp_path):
    """Micro-batches of 16 (the whole batch) and of 4 accumulate the same gradient (compared
    before the AdamW step, see tests/grad_check.py; no clipping, which would hide a gradient
    off by a factor) and log the same loss, grad norm and token count."""
    grads, m = [], []
    for micro in (16, 4):
        t = SFTTrainer(_cfg(tiny_model_dir, arith_data, tmp_path / str(micro),
                            **{"optim.micro_batch_size": micro, "optim.grad_clip": 0}))
        grads.append(record_steps(t.opt, t.params))
        m.append(t.step())
    assert_same_steps(grads[0], grads[1])
    assert m[0]["train/grad_norm"] > 0
    for key in ("train/loss", "train/grad_norm", "train/tokens"):
        assert m[1][key] == pytest.approx(m[0][key], rel=1e-5), (key, m[0][key], m[1][key])


@pytest.mark.parametrize("packing", [False, True])
def test_resume_equals_uninterrupted(tiny_model_dir, arith_data, tmp_path, packing):
    extra = {"data.packing": packing, "trainer.save_every": 3, "trainer.keep_last": 5}
    if packing:
        extra.update({"data.max_length": 32, "data.batch_size": 4, "optim.micro_batch_size": 2})
    full = SFTTrainer(_cfg(tiny_model_dir, arith_data, tmp_path / "full", **extra))
    full.fit()
    first = SFTTrainer(_cfg(tiny_model_dir, arith_data, tmp_path / "cut", **extra))
    for _ in range(3):  # the "crashed" run: 3 steps, a checkpoint, then gone
        first.step_idx += 1
        first.step()
    first.save()
    resumed = SFTTrainer(_cfg(tiny_model_dir, arith_data, tmp_path / "cut", **extra))
    resumed.fit(resume=True)
    for k, v in _weights(full.model).items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k


def test_fit_claims_run_dir_and_reports_skipped_rows(tiny_model_dir, arith_data, tmp_path, capsys):
    """fit() from Python writes config.yaml (the resolved config) and holds the run-dir lock; rows
    dropped by overlong=skip are printed and logged at step 0."""
    from reinforge.config.load import ConfigError
    from reinforge.data import SFTDataset
    from reinforge.trainers.checkpoint import lock_run_dir

    cfg = _cfg(tiny_model_dir, arith_data, tmp_path, **{"trainer.total_steps": 1, "data.max_length": 6,
                                                         "data.overlong": "skip", "trainer.export_hf": False})
    trainer = SFTTrainer(cfg)
    skipped = SFTDataset(arith_data["sft"], trainer.tok, max_length=6, overlong="skip").num_skipped
    assert skipped > 0
    out = capsys.readouterr().out
    assert f"skipped {skipped} training rows longer than data.max_length=6 (data.overlong=skip)" in out, out
    held = lock_run_dir(tmp_path)
    with pytest.raises(ConfigError, match="in use"):
        trainer.fit()
    held.close()
    trainer.fit()
    expected = cfg.to_dict()  # the resolved config: model.gradient_checkpointing `auto` -> "false" (a tiny model)
    expected["model"]["gradient_checkpointing"] = "false"
    assert load_config(SFTConfig, str(tmp_path / "config.yaml")).to_dict() == expected
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0] == {"step": 0, "data/skipped_rows": float(skipped)}
    lock_run_dir(tmp_path).close()  # released when fit() returns


def test_resume_without_checkpoint_says_so(tiny_model_dir, arith_data, tmp_path, capsys):
    trainer = SFTTrainer(_cfg(tiny_model_dir, arith_data, tmp_path))
    assert trainer.resume() == 0 and trainer.step_idx == 0
    assert f"no checkpoint in {tmp_path / 'checkpoints'}; starting from step 0" in capsys.readouterr().err


def test_bf16_autocast_only_when_asked(tiny_model_dir, arith_data, tmp_path):
    """model.autocast=bf16 runs SFT's forward under bf16 autocast: log-probs within bf16 rounding
    of fp32, and not identical to them (the autocast is on); auto leaves SFT in fp32."""
    fp32 = SFTTrainer(_cfg(tiny_model_dir, arith_data, tmp_path / "auto"))
    bf16 = SFTTrainer(_cfg(tiny_model_dir, arith_data, tmp_path / "bf16", **{"model.autocast": "bf16"}))
    batch = collate_rows(fp32.train_rows[:8], fp32.tok.pad_token_id)
    with torch.no_grad():
        ref, auto, low = target_logprobs(fp32.model, batch), fp32._logprobs(batch), bf16._logprobs(batch)
    torch.testing.assert_close(auto, ref, rtol=0, atol=0)
    assert low.dtype == torch.float32 and not torch.equal(low, ref)
    torch.testing.assert_close(low, ref, rtol=0, atol=0.1)
    loss = bf16._nll(batch, None, low.numel())[0]
    loss.backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in bf16.model.parameters())
