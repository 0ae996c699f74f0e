"""Where metrics go: console (progress bar with ETA), metrics.jsonl, TensorBoard, and wandb or
MLflow when installed and asked for. Metrics arrive already reduced to floats, once per step.

A non-finite value (NaN, +-inf) is never dropped silently: metrics.jsonl records it as null, the
step's row gets `nonfinite/count` (how many of its values were non-finite) and the console gets
one warning line per such step naming them. TensorBoard, wandb and MLflow get the finite values
and the count."""
from __future__ import annotations

import json
import math
import sys
import time
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


class RunLogger:
    def __init__(self, run_dir: str | Path, loggers: list[str], total_steps: int, *, start_step: int = 0,
                 progress: bool = True, config: dict | None = None, desc: str = "train",
                 purge_step: int | None = None):
        """`purge_step` (a resumed run's first step): TensorBoard hides the events an earlier run
        logged from that step on, as metrics.jsonl was cut there (run_dir.rewind)."""
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.loggers = set(loggers)  # names checked with the config (config.validate.LOGGERS)
        self.jsonl = open(self.dir / "metrics.jsonl", "a") if "jsonl" in self.loggers else None
        self.tb = None
        if "tensorboard" in self.loggers:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.dir / "tensorboard"), purge_step=purge_step)
        self.wandb = self._optional("wandb", lambda m: m.init(project="reinforge", dir=str(self.dir), config=config))
        self.mlflow = self._optional("mlflow", lambda m: (m.start_run(), m.log_params(_flat(config or {}))))
        self.bar = None
        if progress and "console" in self.loggers:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, desc=desc, dynamic_ncols=True, file=sys.stderr)

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
            print(f"step {step}: " + ", ".join(f"{k}={v}" for k, v in head.items()), file=sys.stderr)

    def advance(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

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


def note_skipped(count: int, what: str, limit: str, policy: str) -> int:
    """Say how many rows a dataset dropped for being too long (overlong=skip); returns count."""
    if count:
        print(f"[reinforge] skipped {count} {what} longer than {limit} ({policy})")
    return count


def skipped_metrics(cfg) -> dict[str, float]:
    """The step-0 record of training rows the data dropped for length (cfg.derived["skipped_rows"],
    filled when the SFT or preference data loads), if any were."""
    n = cfg.derived.get("skipped_rows", 0)
    return {"data/skipped_rows": float(n)} if n else {}
