"""SFT's data.packing on image rows (a tiny Qwen2-VL): packed rows of several image examples give
the loss and the gradients of the unpacked, right-padded rows (each example's own M-RoPE
positions moved into its packed slots, models/packing.packed_example_vision; a completion that
spells the image placeholder stays text), and a packed step trains with the tower frozen."""
from __future__ import annotations

import io
import math

import pytest
import torch
from PIL import Image

from reinforge.data import load_rows, write_rows
from reinforge.trainers.sft import SFTTrainer, collate_rows
from tests.test_vlm_sft_dpo import _assert_trained, _params, _sft_cfg, vlm_data  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_thread")


def _png(size: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (size, size), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


def _loss_and_grads(trainer, rows: list[dict], n_tokens: int, micro: int) -> tuple[float, dict]:
    """The trainer's summed NLL over `rows` in micro-batches of `micro` (its own loss term) and
    the gradients it leaves (eval mode: no dropout)."""
    model = trainer.model.eval()
    model.zero_grad(set_to_none=True)
    total = 0.0
    for i in range(0, len(rows), micro):
        loss, _ = trainer._nll(trainer._to_device(collate_rows(rows[i:i + micro], trainer.tok.pad_token_id)),
                               None, n_tokens)
        loss.backward()
        total += float(loss.detach())
    return total, {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def test_packed_sft_on_image_rows_equals_the_padded_loss(vlm_data, tmp_path):
    rows = load_rows(vlm_data["sft_verl"])
    rows[1] = {**rows[1], "response": "2<|image_pad|> more words"}  # spells the placeholder: a target token
    rows[2] = {**rows[2], "images": [{"bytes": _png(84), "path": None}]}  # a 3x3 merged grid: max(h, w) counts
    train = write_rows(rows, str(tmp_path / "rows.parquet"))
    extra = {"data.max_length": 160, "data.batch_size": 6, "optim.micro_batch_size": 2}
    packed = SFTTrainer(_sft_cfg(vlm_data["model"], train, tmp_path / "packed", **{**extra, "data.packing": True}))
    padded = SFTTrainer(_sft_cfg(vlm_data["model"], train, tmp_path / "padded", **extra))
    assert len(padded.train_rows) == 6 and len(packed.train_rows) < 6
    assert max(len(r["vision"]) for r in packed.train_rows) >= 2  # several image examples share a row
    n_tokens = sum(sum(r["loss_mask"][1:]) for r in padded.train_rows)
    assert n_tokens == sum(sum(r["loss_mask"][1:]) for r in packed.train_rows)
    want, want_g = _loss_and_grads(padded, padded.train_rows, n_tokens, micro=3)
    got, got_g = _loss_and_grads(packed, packed.train_rows, n_tokens, micro=2)
    assert math.isfinite(want) and want > 0
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert want_g.keys() == got_g.keys() and not any("visual" in k for k in want_g)  # the tower is frozen
    scale = max(float(g.abs().max()) for g in want_g.values())
    for k in want_g:
        torch.testing.assert_close(got_g[k], want_g[k], atol=1e-5 * scale, rtol=0, msg=k)
    # a packed step trains the language model and leaves the frozen tower as it was
    tower, lm = _params(packed.model, True), _params(packed.model, False)
    packed.model.zero_grad(set_to_none=True)
    metrics = packed.step()
    assert math.isfinite(metrics["train/loss"])
    _assert_trained(tower, lm, packed.model)
