"""What DPO and reward-model training share: the pair data (train + held-out split), the step
with exact gradient accumulation, held-out evaluation, logging, checkpoints, resume and export.

A subclass supplies `pair_loss(items) -> (loss, metrics)`: the mean loss over the pairs in
`items` and metric tensors that are means over them. The one update loop (workers/update_loop.py)
weights each micro-batch by its share of the pairs, so the gradient and the metrics equal those
of one forward over the batch.
"""
from __future__ import annotations

import hashlib
import random
from pathlib import Path

import torch

from reinforge.trainers.checkpoint import SingleModelCheckpoints, export_hf
from reinforge.trainers.logging import RunLogger, Timer, note_skipped
from reinforge.trainers.loop import TrainingLoop
from reinforge.trainers.plan import SupervisedPlan, resolve_supervised
from reinforge.trainers.run_dir import check_writable
from reinforge.workers.optim import make_optimizer, make_scheduler
from reinforge.workers.update_loop import LossTerm, MiniBatch, NonFiniteGuard, Optim, chunks, run_update


class PairSubset:
    """Some items of a PreferenceDataset, each tagged with "idx", its position in this subset
    (the row of its cached reference log-probs)."""

    def __init__(self, dataset, indices: list[int]):
        self.items = [{**dataset[i], "idx": k} for k, i in enumerate(indices)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, k: int) -> dict:
        return self.items[k]

    def fingerprint(self) -> str:
        """Hash of every pair's token ids (and an image prompt's pixels: its ids only count its
        image tokens), in order: the cache key of per-pair values."""
        h = hashlib.sha256()
        for it in self.items:
            for key in ("prompt_ids", "chosen_ids", "rejected_ids"):
                h.update(repr(it[key]).encode())
            if it.get("vision") is not None:
                h.update(it["vision"].pixel_values.float().numpy().tobytes())
                h.update(repr(it["vision"].image_grid_thw.tolist()).encode())
        return h.hexdigest()[:16]


def unpaired(cfg) -> bool:
    """Whether the run trains on labelled completions rather than pairs (DPO with KTO's loss)."""
    from reinforge.algos.preference import UNPAIRED
    from reinforge.config.preference import DPOConfig

    return isinstance(cfg, DPOConfig) and cfg.dpo.loss_type in UNPAIRED


def load_pairs(plan: SupervisedPlan, tokenizer) -> tuple[PairSubset, PairSubset | None, int]:
    """Training pairs, held-out pairs (val_files, or a seeded val_fraction of the train files)
    and how many training pairs data.overlong=skip dropped, with the datasets handed over in
    Python (plan.rows). For an unpaired loss (KTO) the items are labelled completions instead
    (data.preference.UnpairedPreferenceDataset). ConfigError when fewer pairs than
    data.batch_size remain for training."""
    from reinforge.config.validate import need
    from reinforge.data.preference import PreferenceDataset, UnpairedPreferenceDataset
    from reinforge.trainers.inputs import data_source, make_dataset

    cfg, rows = plan.cfg, plan.rows
    d = cfg.data
    dataset_cls = UnpairedPreferenceDataset if unpaired(cfg) else PreferenceDataset

    def read(files, what: str, key: str):
        parts = [make_dataset(dataset_cls, data_source(f, key, rows or {}), f, tokenizer, max_length=d.max_length,
                              overlong=d.overlong, max_pixels=d.max_pixels) for f in files]
        skipped = note_skipped(sum(p.num_skipped for p in parts), what, f"data.max_length={d.max_length}",
                               "data.overlong=skip")
        return [it for p in parts for it in p.items], skipped

    train, skipped = read(d.train_files, "training pairs", "data.train_files")
    idx = list(range(len(train)))
    val = None
    if d.val_files:
        held, _ = read(d.val_files, "held-out pairs", "data.val_files")
        val = PairSubset(held, list(range(min(len(held), d.max_val_pairs))))
    elif d.val_fraction > 0:
        random.Random(f"{d.seed}:val-split").shuffle(idx)
        n_val = min(max(1, int(len(idx) * d.val_fraction)), d.max_val_pairs)
        val, idx = PairSubset(train, sorted(idx[:n_val])), sorted(idx[n_val:])
    need(len(idx) >= d.batch_size, f"only {len(idx)} training pairs, fewer than data.batch_size={d.batch_size}")
    return PairSubset(train, idx), val, skipped


def load_inputs(cfg, train_dataset=None, eval_dataset=None):
    """The plan, tokenizer, training and held-out pairs and the count of skipped training pairs:
    what DPO and RM both start from. The plan is resolved (and trainer.run_dir checked) before
    anything loads; the number of pairs then fixes its total_steps (when it derives from
    epochs). `cfg` is left as it is. train_dataset / eval_dataset, for Python users: a
    datasets.Dataset, a list of dicts or a path, in place of data.train_files / data.val_files
    (trainers/inputs.py). A vision-language model.path reads the pairs with its processor
    (trainers/rl_setup.load_processing), so image prompts keep their images. Returns
    (plan, text tokenizer, train, val, skipped, the processor or None)."""
    from reinforge.trainers.inputs import python_inputs
    from reinforge.trainers.rl_setup import load_processing

    # validate_preference, the model folders' files, the eval reward functions
    plan = resolve_supervised(*python_inputs(cfg, None, train_dataset, eval_dataset))
    m = plan.cfg.model
    check_writable(plan.cfg.trainer.run_dir)  # before any model loads
    tok, encoder = load_processing(m)
    train, val, skipped = load_pairs(plan, encoder)
    return plan.with_data(len(train)), tok, train, val, skipped, (encoder if encoder is not tok else None)


def pair_tensors(items: list[dict], pad_id: int, device) -> dict[str, torch.Tensor]:
    """Chosen rows then rejected rows, right-padded: input_ids, attention_mask, loss_mask (2B, L)
    (and image prompts' "vision", 2B PromptImages: data.preference.collate_preference)."""
    from reinforge.data import collate_preference

    return _on_device(collate_preference(items, pad_id), device)


def _on_device(batch: dict, device) -> dict:
    """The batch's tensors on `device`; "vision" (per-row PromptImages) as it is."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def unpaired_tensors(items: list[dict], pad_id: int, device) -> dict[str, torch.Tensor]:
    """One row per labelled completion, right-padded: input_ids, attention_mask, loss_mask (B, L)."""
    from reinforge.data.preference import collate_unpaired

    return _on_device(collate_unpaired(items, pad_id), device)


class PairTrainer(SingleModelCheckpoints, TrainingLoop):
    """The loop around `pair_loss`. Subclasses set self.model (the trained module) before
    calling `setup`, may set self.prompt_eval (a PromptEvaluator) after it, and may extend
    `evaluate` and `export`."""

    name = "pref"
    processor = None  # a vision-language model's processor (DPO and RM set it): the export saves its image processor

    def setup(self, plan: SupervisedPlan, tokenizer, train: PairSubset, val: PairSubset | None,
              skipped_rows: int = 0) -> None:
        cfg = plan.cfg
        self.plan, self.cfg, self.tok, self.train, self.val = plan, cfg, tokenizer, train, val
        self.skipped_rows = skipped_rows
        from reinforge.data import PromptLoader

        o = cfg.optim
        self.device, self.micro, self.total_steps = plan.device, plan.micro_batch_size, plan.total_steps
        self.run_dir = Path(cfg.trainer.run_dir)
        self.loader = PromptLoader(train, cfg.data.batch_size, seed=cfg.data.seed)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = make_optimizer(self.params, o.lr, o.weight_decay, o.betas)
        self.sched = make_scheduler(self.opt, o.warmup_steps, self.total_steps, o.lr_schedule)
        self.guard = NonFiniteGuard(o.max_nonfinite_steps, self.name)
        self.optim = Optim(self.params, self.opt, o.grad_clip, self.guard)
        self.timer, self.step_idx = Timer(), 0
        self.prompt_eval = None
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def pair_loss(self, items: list[dict], split: str = "train",
                  **batch_state) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Mean loss over the pairs in `items` (from `split`: train or val) and mean metrics;
        `batch_state` is what `batch_state` returned for the whole batch they belong to."""
        raise NotImplementedError

    def batch_state(self, items: list[dict]) -> dict:
        """Values a loss needs from the whole batch (all micro-batches), computed once before
        them, so that accumulation stays exact (KTO's KL reference point); none by default."""
        return {}

    # ---- one step ---------------------------------------------------------------------------
    def _pass(self, items: list[dict], split: str = "train", optim: Optim | None = None) -> dict[str, float]:
        """`pair_loss` over `items` in micro-batches (the one update loop, workers/update_loop.py):
        each micro-batch's mean loss and metrics count by its share of the pairs, so the gradient and
        the metrics are those of one forward over them; one optimizer step with `optim`."""
        state = self.batch_state(items)  # what a loss needs from the whole batch, once

        def mean_loss(chunk, _chunk, n_pairs: int):
            loss, m = self.pair_loss(chunk, split, **state)
            return loss * len(chunk) / n_pairs, m

        micros = ((chunk, len(chunk) / len(items)) for chunk in chunks(items, self.micro))
        return run_update([MiniBatch(len(items), micros)], [LossTerm("loss", 1.0, mean_loss)], optim=optim).metrics("")

    def step(self) -> dict[str, float]:
        items = next(self.loader)
        with self.timer("update"):
            metrics = self._pass(items, optim=self.optim)
            lr = self.sched.get_last_lr()[0]
            self.sched.step()
        return {**metrics, "lr": lr, **self.timer.pop()}

    @torch.no_grad()
    def evaluate(self, logger: RunLogger | None = None) -> dict[str, float]:
        """Held-out pairs: the same loss and metrics, prefixed val/, without dropout; and the
        policy's accuracy on eval prompts when self.prompt_eval is set (progress on `logger`)."""
        out: dict[str, float] = {}
        if self.val:
            self.model.eval()
            try:  # the held-out set counts as one batch
                out = {f"val/{k}": v for k, v in self._pass([self.val[i] for i in range(len(self.val))], "val").items()}
            finally:
                self.model.train()
        if self.prompt_eval is not None:
            out.update(self.prompt_eval(self.run_dir / "samples" / f"step_{self.step_idx}.jsonl",
                                        sampled=self.val_sampled(), logger=logger))
        return out

    # ---- the loop ---------------------------------------------------------------------------
    @property
    def progress_desc(self) -> str:
        return self.name

    def close(self) -> None:
        if self.prompt_eval is not None:
            self.prompt_eval.close()

    def validate(self, logger: RunLogger) -> dict[str, float]:
        with self.timer("val"):
            m = self.evaluate(logger)
        shown = {k: v for k, v in m.items() if k in ("val/loss", "val/rewards/accuracies", "val/acc_greedy")}
        if shown:
            logger.message(f"step {self.step_idx}: " + ", ".join(f"{k}={v:.4f}" for k, v in shown.items()))
        return {**m, **self.timer.pop()}

    def sampled_val_cost(self) -> float:
        return 1.0 + self.cfg.eval.n if self.prompt_eval is not None else 1.0

    def export(self) -> Path:
        return export_hf(self.model, self.tok, self.run_dir / "hf", processor=self.processor)
