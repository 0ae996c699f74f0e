"""The fit loop every trainer (RL, SFT, DPO, RM) shares.

    refuse mixing with a previous run -> claim run_dir (lock + config.yaml) -> overwrite or
    resume (logs cut back to the checkpoint) -> step 0: validate (trainer.val_before_train), log
    -> for each step: step(), after_step(), validate every trainer.val_every, log, checkpoint
    every trainer.save_every -> export -> close the logger -> finish() -> close()

Validation samples (mean@n, pass@k) only where trainer.val_sampled says (val_sampled(); by
default at the last step), greedy elsewhere. The ETA shown counts the validations still due,
at the time the last one of each kind took (logging.Eta).

SIGTERM (Slurm, `kill`) stops the loop as Ctrl-C does, with `Terminated`, a KeyboardInterrupt;
either signal arriving during a checkpoint save takes effect once the save is complete.

A trainer provides plan (trainers/plan.py: written to config.yaml), cfg (its resolved config,
with a `trainer` section), run_dir, step_idx, total_steps and the methods below; only the hooks
with a default are optional.
"""
from __future__ import annotations

import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from reinforge.trainers.checkpoint import claim_run_dir, latest_checkpoint, no_checkpoint
from reinforge.trainers.logging import Eta, RunLogger, due, skipped_metrics
from reinforge.trainers.run_dir import check_reuse, clear_previous_run, rewind


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread; `signum` gives the exit code 128 + signum."""

    signum = signal.SIGTERM


def _raise_terminated(signum, frame):
    raise Terminated()


@contextmanager
def _signals(handler):
    """Install `handler` ({signal: function}) inside the block and put the old ones back after it.
    A no-op off the main thread, where Python cannot handle signals, and for a signal whose
    handler was set outside Python (getsignal None), which could not be put back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: h for s in handler if (h := signal.getsignal(s)) is not None}
    for s in old:
        signal.signal(s, handler[s])
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def sigterm_interrupts():
    """Inside the block SIGTERM raises Terminated, so it unwinds the run as Ctrl-C does."""
    return _signals({signal.SIGTERM: _raise_terminated})


@contextmanager
def _uninterrupted():
    """Hold SIGINT and SIGTERM while the block runs (a checkpoint save), then deliver the first
    one that came to the handler in place before."""
    pending: list[int] = []
    with _signals({s: lambda n, f: pending.append(n) for s in (signal.SIGINT, signal.SIGTERM)}):
        yield
    if pending:
        signal.raise_signal(pending[0])


class TrainingLoop:
    progress_desc = "train"  # the progress bar's label
    skipped_rows = 0  # training rows the data dropped for length (SFT, DPO, RM: set when the data loads)

    # ---- what each trainer provides ------------------------------------------------------------
    def step(self) -> dict[str, float]:
        raise NotImplementedError

    def validate(self, logger: RunLogger) -> dict[str, float]:
        raise NotImplementedError

    def save(self):
        raise NotImplementedError

    def resume(self, path=None) -> None:
        raise NotImplementedError

    def export(self):
        raise NotImplementedError

    # ---- optional hooks ------------------------------------------------------------------------
    def first_metrics(self) -> dict[str, float]:
        """Logged at step 0 with the first validation (training rows the data dropped, if any)."""
        return skipped_metrics(self.skipped_rows)

    def after_step(self) -> None:
        """Right after each step(), before validation and checkpoint."""

    def finish(self) -> None:
        """After the run's logger is closed: the report (RL, SFT, DPO and RM runs alike)."""
        if self.cfg.trainer.report:
            from reinforge.report import write_report

            write_report(self.run_dir)

    def close(self) -> None:
        """Always, last: release workers and pools."""

    def sampled_val_cost(self) -> float:
        """How many greedy validations one sampled validation costs, for the ETA until both
        kinds have been timed (the RL trainer: 1 + rollout.val_n)."""
        return 1.0

    # ---- for the trainers' validate() -----------------------------------------------------------
    def val_sampled(self, step: int | None = None) -> bool:
        """Whether the validation at `step` (default: the current one) samples as well as decodes
        greedily (trainer.val_sampled: end = only at the last step, always, never)."""
        mode, step = self.cfg.trainer.val_sampled, self.step_idx if step is None else step
        return mode == "always" or (mode == "end" and step == self.total_steps)

    # ---- the loop ------------------------------------------------------------------------------
    def _continue(self, resume: bool | str) -> int | None:
        """Load the checkpoint to resume from (the latest in run_dir, or the path `resume`), say
        which, and cut the run's records back to its step (run_dir.rewind). Returns TensorBoard's
        purge_step, or None when starting over."""
        ckpt = latest_checkpoint(self.run_dir / "checkpoints") if resume is True else Path(resume)
        if ckpt is None:
            no_checkpoint(self.run_dir / "checkpoints")
        else:
            self.resume(str(ckpt))
            print(f"[reinforge] resuming from {ckpt} at step {self.step_idx}", file=sys.stderr)
        return rewind(self.run_dir, self.step_idx) or None

    def _val_plan(self) -> dict[int, str]:
        """The steps after the current one that validate -> "sampled" or "greedy"."""
        t = self.cfg.trainer
        return {s: "sampled" if self.val_sampled(s) else "greedy"
                for s in range(self.step_idx + 1, self.total_steps + 1) if due(t.val_every, s, self.total_steps)}

    def _validate_timed(self, logger: RunLogger, eta: Eta) -> dict[str, float]:
        kind = "sampled" if self.val_sampled() else "greedy"
        t0 = time.perf_counter()
        metrics = self.validate(logger)
        eta.record_val(kind, time.perf_counter() - t0)
        return metrics

    def fit(self, resume: bool | str = False, overwrite: bool = False) -> dict[str, float]:
        """Train to total_steps. `resume`: True (latest checkpoint in run_dir) or a checkpoint path;
        `overwrite`: delete a previous run's artefacts in run_dir first. A run_dir holding a previous
        run (run_dir.previous_run) needs one of the two, or fit raises ConfigError and changes nothing.
        Returns the last value of every metric logged."""
        t = self.cfg.trainer
        last: dict[str, float] = {}
        try:
            check_reuse(self.run_dir, bool(resume), overwrite)
            with sigterm_interrupts(), claim_run_dir(self.run_dir, self.plan.to_dict()):
                if overwrite:
                    clear_previous_run(self.run_dir)
                purge_step = self._continue(resume) if resume else None
                logger = RunLogger(self.run_dir, list(t.loggers), self.total_steps, start_step=self.step_idx,
                                   progress=t.progress, config=self.plan.to_dict(), desc=self.progress_desc,
                                   purge_step=purge_step, project_name=t.project_name,
                                   experiment_name=t.experiment_name)
                eta = Eta(self._val_plan(), self.total_steps, self.sampled_val_cost())
                try:
                    if self.step_idx == 0:
                        last = self._validate_timed(logger, eta) if t.val_before_train else {}
                        first = {**last, **self.first_metrics()}
                        if first:
                            logger.log(0, first)
                    while self.step_idx < self.total_steps:
                        self.step_idx += 1
                        t0 = time.perf_counter()
                        metrics = self.step()
                        self.after_step()
                        eta.record_step(time.perf_counter() - t0)
                        if due(t.val_every, self.step_idx, self.total_steps):
                            metrics.update(self._validate_timed(logger, eta))
                        logger.set_eta(eta.seconds_left(self.step_idx))
                        logger.log(self.step_idx, metrics)
                        logger.advance()
                        last = {**last, **metrics}
                        if due(t.save_every, self.step_idx, self.total_steps):
                            with _uninterrupted():
                                self.save()
                    if t.export_hf:
                        self.export()
                finally:
                    logger.close()
                self.finish()
        finally:
            self.close()
        return last
