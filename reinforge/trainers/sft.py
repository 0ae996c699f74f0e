"""Supervised fine-tuning: next-token loss on response tokens only, with optional packing.

    for step in 1..total_steps:
        rows = loader.next()                            # batch_size rows (examples or packs)
        for micro in rows.split(micro_batch_size):      # exact gradient accumulation:
            loss += -sum(logp[loss_mask]) / batch_tokens  # token-mean over the *whole* batch
        clip, AdamW step, LR schedule

Packing concatenates examples into rows of up to data.max_length tokens. Position ids restart
at 0 for each example (RoPE sees the same positions as unpacked), and a 4D block-diagonal causal
mask keeps attention inside each example, so a packed row's loss equals the unpacked examples'.
Checkpoints hold weights, optimizer, scheduler, RNG and loader position: resume is bit-exact.

A vision-language model.path (a `vision_config` in its config.json) reads the data with its
processor (trainers/rl_setup.load_processing), so image rows (veRL's and TRL's schemas,
data/images.py) keep their images: each row carries its PromptImages, and the loss's forward
(forward.target_logprobs) scatters the image features into the prompt's placeholders with
M-RoPE positions (models/vlm_forward.image_inputs). The vision tower is frozen unless
model.freeze_vision_tower=false; model.lora_rank > 0 puts LoRA adapters on the language model
(models/lora.py, for a text model too). Image rows pack as text rows do (data.packing): each
example's positions are its own M-RoPE positions moved into its packed slots, as the packed RL
forward moves them (models/packing.packed_example_vision), so a packed row's loss equals the
unpacked examples'.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from reinforge.config.sft import SFTConfig
from reinforge.models.forward import position_ids_from_mask, target_logprobs
from reinforge.seeding import seed_everything
from reinforge.trainers.checkpoint import SingleModelCheckpoints, export_hf
from reinforge.trainers.logging import Timer, note_skipped
from reinforge.trainers.loop import TrainingLoop
from reinforge.trainers.plan import SupervisedPlan, resolve_supervised
from reinforge.trainers.run_dir import check_writable
from reinforge.trainers.validation import PromptEvaluator
from reinforge.workers.optim import make_optimizer, make_scheduler
from reinforge.workers.update_loop import LossTerm, MiniBatch, NonFiniteGuard, Optim, chunks, run_update


# ---- data: packing and collation ----------------------------------------------------------------
def pack_examples(items: list[dict], max_length: int) -> list[dict]:
    """Greedily concatenate examples (in order) into rows of <= max_length tokens.

    Each row: input_ids, loss_mask, position_ids (restarting at 0 per example) and segment
    (1, 2, ... per example), all lists of the row's length; when some example has images,
    also `vision`: each example's PromptImages (or None), in segment order.
    """
    with_images = any(it.get("vision") is not None for it in items)

    def empty() -> dict:
        return {"input_ids": [], "loss_mask": [], "position_ids": [], "segment": [], **({"vision": []} if with_images else {})}

    rows, cur = [], empty()
    for it in items:
        n = len(it["input_ids"])
        if cur["input_ids"] and len(cur["input_ids"]) + n > max_length:
            rows.append(cur)
            cur = empty()
        seg = (cur["segment"][-1] if cur["segment"] else 0) + 1
        cur["input_ids"] += it["input_ids"]
        cur["loss_mask"] += it["loss_mask"]
        cur["position_ids"] += list(range(n))
        cur["segment"] += [seg] * n
        if with_images:
            cur["vision"].append(it.get("vision"))
    if cur["input_ids"]:
        rows.append(cur)
    return rows


def collate_rows(rows: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded (B, L) input_ids, loss_mask, position_ids and attention_mask.

    Unpacked rows get a 2D padding mask. Packed rows get a 4D (B, 1, L, L) boolean mask: token q
    may attend to token k iff k <= q and both are in the same example; padding is segment 0, so
    every pad query still sees itself (no all-masked softmax row, whose NaN would leak into
    backward) and real tokens never see pads (they come later). Packed rows also give `segment`
    (B, L) and, with images, `vision`: the examples' PromptImages (or None) in row then segment
    order (the forward computes each example's M-RoPE positions from them:
    models/packing.packed_example_vision).
    """
    from reinforge.models.padding import pad
    from reinforge.data.sft import collate_sft

    if "segment" not in rows[0]:
        out = collate_sft(rows, pad_id)
        out["position_ids"] = position_ids_from_mask(out["attention_mask"])
        return out
    seg, _ = pad([r["segment"] for r in rows], 0)  # (B, L)
    L = seg.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    mask4d = (seg[:, :, None] == seg[:, None, :]) & causal  # (B, L, L)
    out = {"input_ids": pad([r["input_ids"] for r in rows], pad_id)[0],
           "loss_mask": pad([r["loss_mask"] for r in rows], 0)[0],
           "position_ids": pad([r["position_ids"] for r in rows], 0)[0],
           "attention_mask": mask4d[:, None], "segment": seg}
    if "vision" in rows[0]:
        out["vision"] = [v for r in rows for v in r["vision"]]
    return out


def load_sft_data(plan: SupervisedPlan, tok) -> tuple[list[dict], list[dict], int]:
    """Training rows (packed when data.packing), held-out rows (unpacked: the validation loss is
    per example) and how many training rows data.overlong=skip dropped, read and tokenized with
    the length rules (with the datasets handed over in Python: plan.rows); the number of
    training rows fixes the plan's total_steps (`plan.with_data`). `reinforge sft --dry-run`
    stops after this."""
    from reinforge.data import SFTDataset
    from reinforge.trainers.inputs import data_source, make_dataset

    d, rows = plan.cfg.data, plan.rows

    def load(files: list, what: str, key: str) -> tuple[list[dict], int]:
        parts = [make_dataset(SFTDataset, data_source(f, key, rows or {}), f, tok, max_length=d.max_length,
                              overlong=d.overlong, max_pixels=d.max_pixels) for f in files]
        skipped = note_skipped(sum(p.num_skipped for p in parts), what, f"data.max_length={d.max_length}",
                               "data.overlong=skip")
        return [it for p in parts for it in p], skipped

    train, skipped = load(d.train_files, "training rows", "data.train_files")
    # Packing happens once, in file order; the loader then shuffles whole packed rows. Image
    # rows pack too: each example keeps its PromptImages and its own M-RoPE positions.
    train_rows = pack_examples(train, d.max_length) if d.packing else train
    val_rows, _ = load(d.val_files, "held-out rows", "data.val_files")
    return train_rows, val_rows, skipped


# ---- the trainer --------------------------------------------------------------------------------
class SFTTrainer(SingleModelCheckpoints, TrainingLoop):
    progress_desc = "sft"

    def __init__(self, cfg: SFTConfig, train_dataset=None, eval_dataset=None):
        """train_dataset / eval_dataset, for Python users: a datasets.Dataset, a list of dicts or
        a path, in place of data.train_files / data.val_files (trainers/inputs.py)."""
        from reinforge.data import PromptLoader  # a seeded, resumable order
        from reinforge.models.loading import load_causal_lm
        from reinforge.models.lora import with_lora
        from reinforge.trainers.inputs import python_inputs
        from reinforge.trainers.rl_setup import load_processing

        # validate_sft, the model folder's files, the eval reward functions; cfg is left as it is
        plan = resolve_supervised(*python_inputs(cfg, None, train_dataset, eval_dataset))
        self.cfg = cfg = plan.cfg  # the resolved copy
        m, d = cfg.model, cfg.data
        check_writable(cfg.trainer.run_dir)  # before any model loads
        seed_everything(cfg.trainer.seed)
        self.device = plan.device
        # a VLM's processor reads the rows (images -> pixels, image tokens); the rest takes its tokenizer
        self.tok, encoder = load_processing(m)
        self.processor = encoder if encoder is not self.tok else None
        self.train_rows, self.val_rows, self.skipped_rows = load_sft_data(plan, encoder)
        self.plan = plan.with_data(len(self.train_rows))
        self.total_steps = self.plan.total_steps  # trainer.total_steps, or derived from trainer.epochs
        self.loader = PromptLoader(self.train_rows, min(d.batch_size, len(self.train_rows)), seed=d.seed)
        self.model = load_causal_lm(m.path, dtype=m.dtype, device=self.device, trust_remote_code=m.trust_remote_code,
                                    attn_implementation=m.attn_implementation,
                                    gradient_checkpointing=m.gradient_checkpointing,
                                    freeze_vision_tower=m.freeze_vision_tower)
        self.model = with_lora(self.model, m)  # models/lora.py: unchanged when model.lora_rank is 0
        o = cfg.optim
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = make_optimizer(self.params, o.lr, o.weight_decay, o.betas)
        self.sched = make_scheduler(self.opt, o.warmup_steps, self.total_steps, o.lr_schedule)
        self.guard = NonFiniteGuard(o.max_nonfinite_steps, "sft")
        self.optim = Optim(self.params, self.opt, o.grad_clip, self.guard)
        self.run_dir, self.step_idx, self.timer = Path(cfg.trainer.run_dir), 0, Timer()
        # Accuracy on eval.prompt_files: the prompts are read and the reward worker built once.
        self.prompt_eval = PromptEvaluator(self.model, self.tok, cfg.eval, device=self.device, pass_k=cfg.eval.pass_k,
                                           processor=self.processor) if cfg.eval.prompt_files else None

    def _to_device(self, b: dict) -> dict:
        """The batch's tensors on the device; `vision` (per-row PromptImages) as it is."""
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in b.items()}

    def _logprobs(self, batch: dict) -> torch.Tensor:
        """Target log-probs; the decoder's matmuls in bf16 when model.autocast=bf16 is set (SFT
        leaves `auto` at none: its presets were tuned in fp32)."""
        m = self.cfg.model
        with torch.autocast(torch.device(self.device).type, dtype=torch.bfloat16, enabled=m.autocast == "bf16"):
            return target_logprobs(self.model, batch, m.logprob_chunk_size, m.fused_logprobs,
                                   vision=batch.get("vision"))

    def step(self) -> dict[str, float]:
        """One optimizer step over data.batch_size rows, accumulated over micro-batches (the one
        update loop, workers/update_loop.py: one mini-batch of one loss term)."""
        t0 = time.perf_counter()
        rows = next(self.loader)
        n_tokens = sum(sum(r["loss_mask"][1:]) for r in rows)  # the batch's token-mean denominator
        self.model.train()
        micros = ((self._to_device(collate_rows(part, self.tok.pad_token_id)), len(part) / len(rows))
                  for part in chunks(rows, self.plan.micro_batch_size))
        res = run_update([MiniBatch(max(n_tokens, 1), micros)], [LossTerm("loss", 1.0, self._nll)],
                         optim=self.optim)  # a skipped step is logged; several in a row stop the run
        lr = self.sched.get_last_lr()[0]
        self.sched.step()
        dt = time.perf_counter() - t0
        return {**res.metrics("train/"), "train/lr": lr, "train/tokens": float(n_tokens),
                "timing_s/step": dt, "perf/throughput": sum(len(r["input_ids"]) for r in rows) / dt}

    def _nll(self, batch: dict, _micro, n_tokens: int) -> tuple[torch.Tensor, dict]:
        """The micro-batch's summed next-token NLL over the whole batch's target tokens."""
        return -self._logprobs(batch).sum() / n_tokens, {}

    @torch.no_grad()
    def val_loss(self) -> dict[str, float]:
        if not self.val_rows:
            return {}
        was = self.model.training
        self.model.eval()
        total, count = 0.0, 0
        for part in chunks(self.val_rows, self.plan.micro_batch_size):
            logp = self._logprobs(self._to_device(collate_rows(part, self.tok.pad_token_id)))
            total, count = total - float(logp.sum()), count + logp.numel()
        self.model.train(was)
        loss = total / max(count, 1)
        return {"val/loss": loss, "val/ppl": math.exp(min(loss, 50.0))}

    def evaluate(self, logger=None) -> dict[str, float]:
        """Validation loss, and greedy / sampled accuracy and pass@k on eval.prompt_files
        (progress on `logger`, a RunLogger)."""
        with self.timer("val"):
            out = self.val_loss()
            if self.prompt_eval is not None:
                out.update(self.prompt_eval(self.run_dir / "samples" / f"step_{self.step_idx}.jsonl",
                                            sampled=self.val_sampled(), logger=logger))
        return {**out, **self.timer.pop()}

    def validate(self, logger=None) -> dict[str, float]:
        return self.evaluate(logger)

    def sampled_val_cost(self) -> float:
        return 1.0 + self.cfg.eval.n if self.prompt_eval is not None else 1.0

    def export(self) -> Path:
        return export_hf(self.model, self.tok, self.run_dir / "hf", processor=self.processor)

    def close(self) -> None:
        if self.prompt_eval is not None:
            self.prompt_eval.close()
