"""Crash campaign: SIGKILL tiny PPO / GRPO / SFT / DPO / RM runs at random moments and inside
checkpoint saves, replacements, prunes and the HF export, resume them (`--resume`, again when
killed again) to the end, and check what a crash must never cost:

- the final weights (hf/ and the last checkpoint) and trainer state equal an uninterrupted run's
  bit for bit (one reference run per trainer, reused by every trial);
- every folder marked COMPLETE, at every moment after a kill, loads (weights, trainer state,
  config), and hf/, when present, loads;
- metrics.jsonl has one row per step, in order (no duplicates), equal to the uninterrupted
  run's but for timings;
- no temporaries or trash (`.tmp_*`, `.trash_*`, `*.tmp`) are left once a run has finished.

    python scripts/crash_campaign.py                  # 20 trials per trainer
    python scripts/crash_campaign.py --n 5 --trainers sft,dpo --seed 1
    python scripts/crash_campaign.py --kills timing   # no REINFORGE_CRASH_AT hook (any tree)
    python scripts/crash_campaign.py --n 5 --trainers grpo-async1,grpo-async2
    python scripts/crash_campaign.py --n 3 --trainers grpo-ray-async1
    python scripts/crash_campaign.py --n 1 --trainers grpo-ray-async2 --at ray:publish   # targeted

grpo-async1 / grpo-async2: GRPO with the asynchronous producer (rollout.staleness 1 / 2,
rollout.schedule=deterministic, chunks of 3 prompts in rounds of 4), whose checkpoints hold the
rows generated but not trained on: every save lands while rows are in flight, and the named
point `async:state` kills a save right after it gathered them (nothing written yet).

grpo-ray-async1 / 2: the same on trainer.backend=ray (1 trainer rank, 1 rollout-worker actor fed
versioned weight publications, distributed/rollout_workers.py); each run starts its own local Ray
cluster (~10 s). Its named point `ray:publish` kills the driver once the ranks built a step's
publication and before the producer has it. grpo-ray-async1-partial: staleness 1 with partial
rollouts (rollout.partial=true: the worker switches to v + 1 mid-generation, distributed/partial.py).
`--at POINT` makes every trial's first kill land at that named point.

Kills: a random delay within an uninterrupted run's duration; a random delay after a `.tmp_` or
`.trash_` folder appears (the parent polls every millisecond); and the named points of
reinforge.trainers.checkpoint.crash_point (REINFORGE_CRASH_AT=<point>, set in that run only),
which land in windows too short to hit by timing (between two renames). Each trial is one of
the scenarios in SCENARIOS. Runs are forked from this process after it imported reinforge
once (no interpreter start per run), with one intra-op thread. Exit status 1 if any check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

torch.set_num_threads(1)  # before any op: forked children must not inherit a started thread pool
# What every run imports (~5 s), once here rather than in each forked run.
import pyarrow.parquet  # noqa: E402,F401
import reinforge.cli.errors  # noqa: E402,F401
from reinforge.cli.main import main as cli_main  # noqa: E402
from reinforge.trainers import dpo, rl, rm, sft  # noqa: E402,F401
# A graded reward (so GRPO's advantages are not all 0), marked bounded: scored in the trainer
# process, with no reward worker process to start in every run.
REWARD_PY = '''def digit_fraction(prompt, response, ground_truth, **extra):
    return {"score": sum(c.isdigit() for c in response) / max(len(response), 1)}


digit_fraction.bounded = True
'''
STEPS = 4
# (save:trashed, a save over an existing step_N, cannot happen in a run: resuming drops later steps.)
SAVE_POINTS = ("save:written", "save:sealed", "save:renamed")
ASYNC_POINTS = ("async:state",)  # an asynchronous run's save, its rows in flight gathered, nothing written
# trainer.backend=ray with rollout workers: the driver killed once the ranks built a weight
# publication, before the producer has it (after the step's update, before its save)
RAY_ASYNC_POINTS = ("ray:publish",)
PRUNE_POINTS = ("prune:trashed", "rewind:trashed")  # rewind: resuming drops later checkpoints
EXPORT_POINTS = ("export:written", "export:trashed", "export:renamed")
# What a trial's first kill aims at: any moment; a save; a prune; a run resumed from its first
# kept step (`--resume-from`: rewind drops the later step, the save writes it again); the first
# export; a finished run re-exporting (`--resume` after the end: hf/ is replaced).
SCENARIOS = ("random", "save", "prune", "replace", "export", "reexport")


def trainer_argv(trainer: str, work: Path, run_dir: Path) -> list[str]:
    """The CLI command of a seconds-long run: STEPS steps, a checkpoint every step, two kept,
    no validation, HF export at the end."""
    data, model = work / "data", work / "model"
    common = {"model.path": model, "trainer.run_dir": run_dir, "trainer.save_every": 1, "trainer.keep_last": 2,
              "trainer.val_before_train": False, "trainer.progress": False, "trainer.loggers": "[jsonl]",
              "trainer.export_hf": True}
    if trainer in ("ppo", "grpo") or trainer.startswith(("grpo-async", "grpo-ray-async")):
        cmd = ["train", "--config", trainer.split("-")[0]]
        over = {"data.train_files": f"[{data / 'train.parquet'}]", "data.val_files": "[]",
                "data.max_prompt_length": 8, "rollout.max_response_length": 6, "data.train_batch_size": 4,
                "rollout.n": 4, "trainer.total_steps": STEPS,
                "reward.functions": f"[{{name: '{work / 'reward.py'}:digit_fraction'}}]",
                "actor.micro_batch_size": 8, "actor.lr": 1e-3, "critic.lr": 1e-3, "trainer.report": False}
        if trainer.startswith("grpo-async"):
            over.update({"rollout.staleness": int(trainer[len("grpo-async"):]), "rollout.schedule": "deterministic",
                         "rollout.stream_prompts": 3})
        if trainer.startswith("grpo-ray-async"):
            over.update(ray_async_overrides(trainer))
    elif trainer == "sft":
        cmd = ["sft", "--config", "sft"]
        over = {"data.train_files": f"[{data / 'sft.parquet'}]", "data.max_length": 16, "data.batch_size": 16,
                "optim.micro_batch_size": 16, "optim.lr": 3e-3, "trainer.total_steps": STEPS,
                "optim.lr_schedule": "cosine", "optim.warmup_steps": 2}
    else:  # dpo, rm
        cmd = [trainer, "--config", trainer]
        over = {"data.train_files": f"[{data / 'prefs.parquet'}]", "data.val_fraction": 0.0, "data.max_length": 16,
                "data.batch_size": 8, "optim.micro_batch_size": 4, "trainer.total_steps": STEPS, "optim.lr": 3e-3}
    return cmd + [f"{k}={v}" for k, v in {**common, **over}.items()]


def ray_async_overrides(trainer: str) -> dict:
    """grpo-ray-async<k>[-partial]: the asynchronous GRPO run on Ray, 1 trainer rank + 1
    rollout-worker actor (weights as versioned publications), staleness k, deterministic
    schedule; -partial: with partial rollouts."""
    k, _, partial = trainer[len("grpo-ray-async"):].partition("-")
    return {"trainer.backend": "ray", "trainer.rollout_workers": 1, "rollout.staleness": int(k),
            "rollout.schedule": "deterministic", "rollout.stream_prompts": 3, "rollout.partial": partial == "partial"}


def model_files(trainer: str) -> list[str]:
    return {"ppo": ["actor", "critic"], "grpo": ["actor"]}.get(trainer.split("-")[0], ["model"])


# ---- running and killing ---------------------------------------------------------------------
@dataclass
class Kill:
    """When to SIGKILL a run: `after` seconds from its start; or `after` seconds once a folder
    whose name starts with one of `watch` appears (with `gone`: has appeared and gone again),
    looked for from `not_before` seconds on; or at crash point `point` (in the child). `phase`
    names where a kill lands when the folders present at that moment do not tell."""
    after: float = 0.0
    watch: tuple[str, ...] = ()
    gone: bool = False
    not_before: float = 0.0
    point: str | None = None
    phase: str = "other"


@dataclass
class Outcome:
    rc: int | None  # exit status, None when killed
    phase: str = ""  # where a kill landed: save, prune, export, other


def _leftover_names(run_dir: Path) -> list[str]:
    names = []
    for folder in (run_dir, run_dir / "checkpoints"):
        try:
            names += os.listdir(folder)
        except FileNotFoundError:
            pass
    return names


def _phase(names: list[str], point: str | None) -> str:
    """Classify a kill by the crash point, or else by the hidden folders present when it landed."""
    if point:
        return {"rewind": "prune", "async": "save", "ray": "other"}.get(point.split(":")[0], point.split(":")[0])
    if any(n.startswith((".tmp_hf", ".trash_hf")) or n == "hf.tmp" for n in names):
        return "export"
    if any(n.startswith(".tmp_step") for n in names):
        return "save"
    if any(n.startswith(".trash_step") for n in names):
        return "prune"
    return "other"


def run(argv: list[str], run_dir: Path, log: Path, kill: Kill | None = None) -> Outcome:
    """Fork, run the CLI `argv` in the child (stdout/stderr to `log`) and kill it as `kill` says.
    The child leads a process group, killed whole (reward worker processes too) once it is dead."""
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.setpgid(0, 0)
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            if kill is not None and kill.point:
                os.environ["REINFORGE_CRASH_AT"] = kill.point
            code = cli_main(argv)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    try:
        os.setpgid(pid, pid)  # also here: a kill may come before the child's own call
    except OSError:
        pass
    start, armed, appeared = time.monotonic(), None, False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
                return Outcome(None, _phase(_leftover_names(run_dir), kill.point if kill else None))
            return Outcome(os.waitstatus_to_exitcode(status))
        if kill is not None and kill.point is None:
            if armed is None and time.monotonic() - start >= kill.not_before:
                present = any(n.startswith(kill.watch) for n in _leftover_names(run_dir)) if kill.watch else True
                appeared = appeared or present
                if (appeared and not present) if kill.gone else present:
                    armed = time.monotonic()
            if armed is not None and time.monotonic() - armed >= kill.after:
                phase = _phase(_leftover_names(run_dir), None)
                os.killpg(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return Outcome(None, kill.phase if phase == "other" else phase)
        time.sleep(0.001)


# ---- checks ----------------------------------------------------------------------------------
def same(a, b) -> bool:
    """Bit-for-bit equality of nested trainer state (tensors, arrays, dicts, sequences)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def same_weights(a: Path, b: Path) -> bool:
    return same(load_file(str(a)), load_file(str(b)))


def unloadable(run_dir: Path, models: list[str]) -> list[str]:
    """COMPLETE step folders (and hf/) that do not load, read independently of reinforge's own
    check: every model's safetensors, trainer_state.pt, config.yaml."""
    bad = []
    for step in sorted((run_dir / "checkpoints").glob("step_*")):
        if not (step / "COMPLETE").exists():
            continue
        try:
            for m in models:
                load_file(str(step / f"{m}.safetensors"))
            torch.load(step / "trainer_state.pt", weights_only=False)
            if not (step / "config.yaml").read_text():
                raise ValueError("empty config.yaml")
        except Exception:
            bad.append(step.name)
    hf = run_dir / "hf"
    if hf.exists():
        try:
            load_file(str(hf / "model.safetensors"))
            if not (hf / "config.json").read_text():
                raise ValueError("empty config.json")
        except Exception:
            bad.append("hf")
    return bad


def metric_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the timings (timing_s/*, perf/*), which no two runs share."""
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/"))} for r in rows]


def leftovers(run_dir: Path) -> list[str]:
    return [n for n in _leftover_names(run_dir) if n.startswith((".tmp_", ".trash_")) or n.endswith(".tmp")]


# ---- trials ----------------------------------------------------------------------------------
@dataclass
class Tally:
    trials: int = 0
    kills: int = 0
    phases: dict = field(default_factory=lambda: {"save": 0, "prune": 0, "export": 0, "other": 0})
    resumes: int = 0
    exact: int = 0
    unloadable: int = 0
    duplicates: int = 0
    mismatches: int = 0  # metric rows (timings aside) differ from the reference's otherwise
    leftovers: int = 0
    failed: int = 0  # runs that exited non-zero without being killed
    notes: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.exact == self.trials and not self.unloadable and not self.duplicates and not self.mismatches
                and not self.leftovers and not self.failed)


@dataclass
class Reference:
    run_dir: Path
    seconds: float
    rows: list[dict]


def reference_run(trainer: str, work: Path) -> Reference:
    run_dir = work / f"ref_{trainer}"
    shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.monotonic()
    out = run(trainer_argv(trainer, work, run_dir), run_dir, work / f"ref_{trainer}.log")
    if out.rc != 0:
        sys.exit(f"reference run of {trainer} failed (exit {out.rc}); see {work / f'ref_{trainer}.log'}")
    seconds = time.monotonic() - t0
    if same_weights(run_dir / "hf" / "model.safetensors", work / "model" / "model.safetensors"):
        sys.exit(f"the reference run of {trainer} did not change the weights: bit-exact checks would prove nothing")
    return Reference(run_dir, seconds, metric_rows(run_dir))


def first_kill(scenario: str, rng: random.Random, ref: Reference, points: bool, asynchronous: bool = False,
               ray_points: tuple[str, ...] = ()) -> Kill:
    """The kill of a trial's first interrupted run (for replace/reexport: of the second run)."""
    export = (".tmp_hf", ".trash_hf", "hf.tmp")  # hf.tmp: the export's temporary before this protocol
    hidden = {"save": (".tmp_step",), "prune": (".trash_step",), "replace": (".tmp_step", ".trash_step"),
              "export": export, "reexport": export}
    save_points = (SAVE_POINTS + ASYNC_POINTS if asynchronous else SAVE_POINTS) + ray_points
    named = {"save": save_points, "prune": PRUNE_POINTS[:1], "replace": save_points + PRUNE_POINTS,
             "export": EXPORT_POINTS, "reexport": EXPORT_POINTS}
    if scenario == "random":
        return Kill(after=rng.uniform(0, ref.seconds))
    if points and rng.random() < 0.5:
        return Kill(point=rng.choice(named[scenario]))
    # A random one of a fresh run's saves and prunes: watching starts at a random moment.
    not_before = rng.uniform(0, 0.7 * ref.seconds) if scenario in ("save", "prune") else 0.0
    if scenario == "prune" and rng.random() < 0.5:  # a prune follows a save's rename at once
        return Kill(after=rng.uniform(0, 0.002), watch=(".tmp_step",), gone=True, not_before=not_before,
                    phase="prune")
    return Kill(after=rng.uniform(0, 0.03), watch=hidden[scenario], not_before=not_before)


def trial(trainer: str, work: Path, ref: Reference, rng: random.Random, tally: Tally, points: bool,
          max_kills: int = 4, at: str | None = None) -> None:
    """One trial; `at`: its first kill at that named crash point (else a scenario's)."""
    run_dir = work / f"trial_{trainer}"
    shutil.rmtree(run_dir, ignore_errors=True)
    argv, models, log = trainer_argv(trainer, work, run_dir), model_files(trainer), work / f"trial_{trainer}.log"
    scenario = rng.choice(SCENARIOS) if at is None else f"at {at}"
    tally.trials += 1

    def attempt(extra: list[str], kill: Kill | None) -> bool:
        """One run; True when it was killed. Counts kills, phases, failures and broken folders."""
        out = run(argv[:3] + extra + argv[3:], run_dir, log, kill)
        if out.rc is None:
            tally.kills += 1
            tally.phases[out.phase] += 1
            bad = unloadable(run_dir, models)
            tally.unloadable += len(bad)
            if bad:
                tally.notes.append(f"{scenario}: after a kill ({out.phase}) unloadable COMPLETE {bad}")
            return True
        if out.rc != 0:
            tally.failed += 1
            tally.notes.append(f"{scenario}: {' '.join(argv[:1] + extra)} exited {out.rc}: "
                               f"{log.read_text().strip().splitlines()[-1:]}")
        return False

    if scenario in ("replace", "reexport"):
        attempt([], None)  # a finished run with checkpoints and hf/ to replace
    if scenario == "replace":
        earlier = sorted(int(p.name.split("_")[1]) for p in (run_dir / "checkpoints").glob("step_*"))[:1]
        extra = ["--resume-from", str(run_dir / "checkpoints" / f"step_{earlier[0]}")] if earlier else []
    else:
        extra = ["--resume"] if scenario == "reexport" else []
    asynchronous, ray = trainer.startswith(("grpo-async", "grpo-ray-async")), trainer.startswith("grpo-ray-async")
    kill = Kill(point=at) if at else first_kill(scenario, rng, ref, points, asynchronous,
                                                RAY_ASYNC_POINTS if ray else ())
    killed = attempt(extra, kill)
    kills = 1
    while killed or not (run_dir / "hf").exists():
        tally.resumes += 1
        again = kills < max_kills and rng.random() < 0.3
        if again:
            kills += 1
        killed = attempt(["--resume"], Kill(after=rng.uniform(0, ref.seconds)) if again else None)
        if not killed and not (run_dir / "hf").exists():
            break  # failed; already counted
    final = run_dir / "checkpoints" / f"step_{STEPS}"
    refc = ref.run_dir / "checkpoints" / f"step_{STEPS}"
    try:
        exact = (same_weights(run_dir / "hf" / "model.safetensors", ref.run_dir / "hf" / "model.safetensors")
                 and all(same_weights(final / f"{m}.safetensors", refc / f"{m}.safetensors") for m in models)
                 and same(torch.load(final / "trainer_state.pt", weights_only=False),
                          torch.load(refc / "trainer_state.pt", weights_only=False)))
    except Exception as e:  # a missing or unreadable final file
        exact = False
        tally.notes.append(f"{scenario}: final state unreadable: {e}")
    tally.exact += exact
    if not exact:
        tally.notes.append(f"{scenario}: final state differs from the reference")
    bad = unloadable(run_dir, models)
    tally.unloadable += len(bad)
    rows = metric_rows(run_dir)
    steps = [r["step"] for r in rows]
    if any(b <= a for a, b in zip(steps, steps[1:])):
        tally.duplicates += 1
        tally.notes.append(f"{scenario}: metric steps {steps}")
    elif rows != ref.rows:
        tally.mismatches += 1
        tally.notes.append(f"{scenario}: metric rows differ from the reference's (steps {steps})")
    if left := leftovers(run_dir):
        tally.leftovers += 1
        tally.notes.append(f"{scenario}: leftovers {left}")


def setup(work: Path) -> None:
    """Tiny arithmetic data, a tiny model and the reward function, made once per work folder."""
    (work / "reward.py").write_text(REWARD_PY)
    if not (work / "data" / "prefs.parquet").exists():
        cli_main(["data", "make", "arithmetic", "digits=1", "--out", str(work / "data"), "--n-train", "64",
                  "--n-test", "8", "--n-sft", "64"])
    if not (work / "model" / "config.json").exists():
        cli_main(["model", "--out", str(work / "model"), "--hidden", "64", "--layers", "2"])


def print_table(tallies: dict[str, Tally], seconds: dict[str, float]) -> None:
    cols = ["trainer", "trials", "kills", "in save", "in prune", "in export", "resumes", "bit-exact yes/no",
            "unloadable COMPLETE", "duplicate metrics", "other metric mismatch", "leftovers", "failed runs", "seconds"]
    rows = [[name, t.trials, t.kills, t.phases["save"], t.phases["prune"], t.phases["export"], t.resumes,
             f"{t.exact}/{t.trials - t.exact}", t.unloadable, t.duplicates, t.mismatches, t.leftovers, t.failed,
             f"{seconds[name]:.0f}"] for name, t in tallies.items()]
    widths = [max(len(str(r[i])) for r in [cols] + rows) for i in range(len(cols))]
    for r in [cols] + rows:
        print("  ".join(str(v).rjust(w) for v, w in zip(r, widths)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20, help="trials per trainer")
    ap.add_argument("--trainers", default="ppo,grpo,sft,dpo,rm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default="/tmp/reinforge_crash_campaign", help="scratch folder (data, model, runs)")
    ap.add_argument("--kills", choices=("all", "timing"), default="all",
                    help="timing: random delays and folder watching only, no REINFORGE_CRASH_AT points")
    ap.add_argument("--at", default=None, help="every trial's first kill at this REINFORGE_CRASH_AT point "
                                              "(e.g. ray:publish, async:state, save:sealed)")
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    setup(work)
    rng = random.Random(args.seed)
    tallies, seconds = {}, {}
    for trainer in args.trainers.split(","):
        t0 = time.monotonic()
        ref = reference_run(trainer, work)
        tally = tallies[trainer] = Tally()
        for i in range(args.n):
            trial(trainer, work, ref, rng, tally, points=args.kills == "all", at=args.at)
        seconds[trainer] = time.monotonic() - t0
        print(f"{trainer}: {tally.trials} trials in {seconds[trainer]:.0f} s (reference run {ref.seconds:.1f} s)",
              file=sys.stderr)
        for note in tally.notes:
            print(f"  {trainer}: {note}", file=sys.stderr)
    print_table(tallies, seconds)
    return 0 if all(t.ok for t in tallies.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
