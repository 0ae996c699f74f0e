"""Where metrics go: console (progress bar with ETA), metrics.jsonl, TensorBoard, and wandb or
MLflow when installed and asked for. Metrics arrive already reduced to floats, once per step.

A non-finite value (NaN, +-inf) is never dropped silently: metrics.jsonl records it as null, the
step's row gets `nonfinite/count` (how many of its values were non-finite) and the console gets
one warning line per such step naming them. TensorBoard, wandb and MLflow get the finite values
and the count."""
from __future__ import annotations

import json
import math
import os
import sys
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path

HEADLINE = ("critic/score/mean", "val/acc_greedy", "actor/pg_loss", "actor/entropy", "response_length/mean")


class Timer:
    """`with timer("gen"):` accumulates `timing_s/gen` for the current step."""

    def __init__(self):
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[f"timing_s/{name}"] = self.times.get(f"timing_s/{name}", 0.0) + time.perf_counter() - t0

    def pop(self) -> dict[str, float]:
        out, self.times = self.times, {}
        return out


def split_finite(metrics: dict) -> tuple[dict[str, float], dict[str, float]]:
    """Numeric metrics as floats -> (finite ones plus `nonfinite/count` when any is not, non-finite ones)."""
    values = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
    bad = {k: v for k, v in values.items() if not math.isfinite(v)}
    finite = {k: v for k, v in values.items() if k not in bad}
    if bad:
        finite["nonfinite/count"] = float(len(bad))
    return finite, bad


class Eta:
    """Seconds left in a run: the training steps to go at the recent step time, plus each
    validation still due at the time the last one of its kind took.

    `plan` maps each step that validates to its kind, "greedy" or "sampled"
    (validation.sampled_due); `sampled_cost` is how many greedy validations one sampled
    validation is worth, for estimating a kind not yet measured (the RL trainer: 1 + val_n)."""

    def __init__(self, plan: dict[int, str], total_steps: int, sampled_cost: float = 1.0, window: int = 10):
        self.plan, self.total, self.sampled_cost = plan, total_steps, sampled_cost
        self.step_times: deque[float] = deque(maxlen=window)  # the last `window` steps, validation excluded
        self.val_times: dict[str, float] = {}

    def record_step(self, seconds: float) -> None:
        self.step_times.append(seconds)

    def record_val(self, kind: str, seconds: float) -> None:
        self.val_times[kind] = seconds

    def val_seconds(self, kind: str) -> float | None:
        """The measured time of a `kind` validation, or one estimated from the other kind."""
        if kind in self.val_times:
            return self.val_times[kind]
        if "greedy" in self.val_times:
            return self.val_times["greedy"] * self.sampled_cost
        if "sampled" in self.val_times:
            return self.val_times["sampled"] / self.sampled_cost
        return None

    def seconds_left(self, step: int) -> float | None:
        """After `step` (steps done); None until a training step has been timed."""
        if not self.step_times:
            return None
        left = (self.total - step) * sum(self.step_times) / len(self.step_times)
        for s, kind in self.plan.items():
            if s > step:
                left += self.val_seconds(kind) or 0.0
        return left


def _format_eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    from tqdm import tqdm

    return tqdm.format_interval(seconds)


# tqdm's own remaining time extrapolates its step rate, which validation steps inflate and
# which knows nothing of the validations to come; the bar shows Eta's instead.
_BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<ETA, {rate_fmt}{postfix}]"


def run_names(project_name: str | None, experiment_name: str | None, run_dir: Path) -> tuple[str, str]:
    """(wandb project, run name): trainer.project_name, else $WANDB_PROJECT, else "reinforge";
    trainer.experiment_name, else the run directory's folder name."""
    project = project_name or os.environ.get("WANDB_PROJECT") or "reinforge"
    return project, experiment_name or run_dir.resolve().name


class RunLogger:
    def __init__(self, run_dir: str | Path, loggers: list[str], total_steps: int, *, start_step: int = 0,
                 progress: bool = True, config: dict | None = None, desc: str = "train",
                 purge_step: int | None = None, project_name: str | None = None,
                 experiment_name: str | None = None):
        """`purge_step` (a resumed run's first step): TensorBoard hides the events an earlier run
        logged from that step on, as metrics.jsonl was cut there (run_dir.rewind).
        `project_name` / `experiment_name`: the wandb project and run name (run_names); MLflow's
        experiment (unset: MLflow's default) and run name; a text note in TensorBoard."""
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.loggers = set(loggers)  # names checked with the config (config.validate.LOGGERS)
        self.total = total_steps
        self.jsonl = open(self.dir / "metrics.jsonl", "a") if "jsonl" in self.loggers else None
        project, name = run_names(project_name, experiment_name, self.dir)
        self.tb = None
        if "tensorboard" in self.loggers:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.dir / "tensorboard"), purge_step=purge_step)
            if purge_step is None:
                self.tb.add_text("run", f"project: {project_name or '-'}, experiment: {name}", 0)
        self.wandb = self._optional("wandb", lambda m: m.init(project=project, name=name, dir=str(self.dir),
                                                              config=config))
        self.mlflow = self._optional("mlflow", lambda m: self._start_mlflow(m, project_name, name, config))
        self.bar = None
        if progress and "console" in self.loggers:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, desc=desc, dynamic_ncols=True, file=sys.stderr,
                            bar_format=_BAR_FORMAT.replace("ETA", "?"))
        self.eta_text = "?"

    @staticmethod
    def _start_mlflow(mlflow, experiment: str | None, name: str, config: dict | None) -> None:
        if experiment:
            mlflow.set_experiment(experiment)
        mlflow.start_run(run_name=name)
        mlflow.log_params(_flat(config or {}))

    def _optional(self, name: str, start):
        if name not in self.loggers:
            return None
        try:
            module = __import__(name)
        except ImportError:
            print(f"[reinforge] logger {name!r} asked for but not installed; skipping it", file=sys.stderr)
            return None
        start(module)
        return module

    def log(self, step: int, metrics: dict) -> None:
        m, bad = split_finite(metrics)
        if bad:
            self.warn(f"[reinforge] step {step}: non-finite " + ", ".join(f"{k}={v}" for k, v in bad.items())
                      + " (logged as null)")
        if self.jsonl:
            self.jsonl.write(json.dumps({"step": step, **m, **dict.fromkeys(bad)}) + "\n")
            self.jsonl.flush()
        if self.tb:
            for k, v in m.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb:
            self.wandb.log(m, step=step)
        if self.mlflow:
            self.mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in m.items()}, step=step)
        head = {k.split("/")[-2] + "/" + k.split("/")[-1] if k.count("/") > 1 else k: round(v, 4)
                for k, v in m.items() if k in HEADLINE}
        if self.bar is not None:
            self.bar.set_postfix(head, refresh=False)
        elif "console" in self.loggers:
            print(f"step {step}/{self.total} (eta {self.eta_text}): " + ", ".join(f"{k}={v}" for k, v in head.items()),
                  file=sys.stderr)

    def set_eta(self, seconds: float | None) -> None:
        """The run's remaining time (Eta.seconds_left), shown from now on."""
        self.eta_text = _format_eta(seconds)
        if self.bar is not None:
            self.bar.bar_format = _BAR_FORMAT.replace("ETA", self.eta_text)

    def advance(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    @contextmanager
    def val_progress(self, total: int, what: str):
        """Progress of one validation of `total` units (`what`, e.g. "64 prompts x (1 greedy + 4
        sampled)"): a second bar under the training bar, or a status line when there is no bar.
        Yields update(k), to call as k more units are done."""
        if self.bar is None:
            if "console" in self.loggers:
                print(f"validating: {what}", file=sys.stderr)
            yield lambda k: None
            return
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="validation", unit="seq", position=1, leave=False, dynamic_ncols=True,
                   file=sys.stderr, postfix=what)
        try:
            yield bar.update
        finally:
            bar.close()

    def message(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        elif "console" in self.loggers:
            print(text, file=sys.stderr)

    def warn(self, text: str) -> None:
        """A line on stderr (above the progress bar, if any), whichever loggers are on."""
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.jsonl:
            self.jsonl.close()
        if self.tb:
            self.tb.close()
        if self.wandb:
            self.wandb.finish()
        if self.mlflow:
            self.mlflow.end_run()


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = str(v)[:250]
    return out


def due(every: int, step: int, total: int) -> bool:
    """Whether something done "every k steps (0: only at the end)" happens at `step`: at each
    multiple of `every`, and always at the last step `total`."""
    return step == total or (bool(every) and step % every == 0)


def samples_due(every: int, step: int) -> bool:
    """Whether training samples are written at `step` (trainer.log_samples_every): at step 1,
    so the first rollouts can be read at once, and at each multiple of `every`; never for 0."""
    return bool(every) and (step == 1 or step % every == 0)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    """`rows` as one JSON object a line, replacing the file (a resumed run rewrites its steps):
    reinforge.data.write_rows, which creates the folder."""
    from reinforge.data.io import write_rows

    write_rows(rows, path)


def note_skipped(count: int, what: str, limit: str, policy: str) -> int:
    """Say how many rows a dataset dropped for being too long (overlong=skip); returns count."""
    if count:
        print(f"[reinforge] skipped {count} {what} longer than {limit} ({policy})")
    return count


def skipped_metrics(n: int) -> dict[str, float]:
    """The step-0 record of the `n` training rows the data dropped for length (counted when the
    SFT or preference data loads), if any were."""
    return {"data/skipped_rows": float(n)} if n else {}
