"""The fit loop every trainer (RL, SFT, DPO, RM) shares.

    claim run_dir (lock + config.yaml) -> resume -> step 0: validate, log -> for each step:
    step(), after_step(), validate every trainer.val_every, log, checkpoint every
    trainer.save_every -> export -> close the logger -> finish() -> close()

A trainer provides cfg (with a `trainer` section), run_dir, step_idx, total_steps and the
methods below; only the hooks with a default are optional.
"""
from __future__ import annotations

from reinforge.trainers.checkpoint import claim_run_dir
from reinforge.trainers.logging import RunLogger, due, skipped_metrics


class TrainingLoop:
    progress_desc = "train"  # the progress bar's label

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
        return skipped_metrics(self.cfg)

    def after_step(self) -> None:
        """Right after each step(), before validation and checkpoint."""

    def finish(self) -> None:
        """After the run's logger is closed (e.g. render the report)."""

    def close(self) -> None:
        """Always, last: release workers and pools."""

    # ---- the loop ------------------------------------------------------------------------------
    def fit(self, resume: bool | str = False) -> dict[str, float]:
        """Train to total_steps. `resume`: True (latest checkpoint in run_dir) or a checkpoint path.
        Returns the last value of every metric logged."""
        t = self.cfg.trainer
        last: dict[str, float] = {}
        try:
            with claim_run_dir(self.run_dir, self.cfg):
                if resume:
                    self.resume(None if resume is True else resume)
                logger = RunLogger(self.run_dir, list(t.loggers), self.total_steps, start_step=self.step_idx,
                                   progress=t.progress, config=self.cfg.to_dict(), desc=self.progress_desc)
                try:
                    if self.step_idx == 0:
                        last = self.validate(logger) if t.val_before_train else {}
                        first = {**last, **self.first_metrics()}
                        if first:
                            logger.log(0, first)
                    while self.step_idx < self.total_steps:
                        self.step_idx += 1
                        metrics = self.step()
                        self.after_step()
                        if due(t.val_every, self.step_idx, self.total_steps):
                            metrics.update(self.validate(logger))
                        logger.log(self.step_idx, metrics)
                        logger.advance()
                        last = {**last, **metrics}
                        if due(t.save_every, self.step_idx, self.total_steps):
                            self.save()
                    if t.export_hf:
                        self.export()
                finally:
                    logger.close()
                self.finish()
        finally:
            self.close()
        return last
