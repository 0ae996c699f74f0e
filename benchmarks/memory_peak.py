"""Where reinforge's peak resident memory is, at the Qwen2.5-0.5B shape with the real vocabulary.

    python benchmarks/memory_peak.py [--layers 6] [--steps 2] [--threads 2] [--override key=value ...]

Builds the benchmark's Qwen2-shaped model (benchmarks/vs_trl.py `qwen0.5b`, `--layers K` of its
24), runs `--steps` GRPO steps of 4 prompts x 4 samples, 32 response tokens, and samples the
process's resident set every millisecond from a thread. At each new maximum it keeps the main
thread's Python stack, so the report names the line the peak happened in, per step and stage
(generation, update), next to the floor of fp32 AdamW training (16 bytes per parameter plus the
batch's fp32 logits, benchmarks/floors.py). The resident set is read from /proc/self/statm,
which the kernel updates as pages are touched, so the peak is what /usr/bin/time would report.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

PAGE = os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2():
    """glibc's mallinfo2, resolved once (None where the C library has none: glibc < 2.33, musl)."""
    fn = getattr(ctypes.CDLL(None), "mallinfo2", None)
    if fn is not None:
        fn.restype = _MallInfo2
    return fn


_MALLINFO2 = _mallinfo2()


def heap_split() -> dict:
    """glibc's view (all arenas): bytes in use from the heaps, free but kept in them, and mmapped
    chunks; empty without mallinfo2. Called by the sampler at each new peak, so nothing is looked
    up here."""
    if _MALLINFO2 is None:
        return {}
    m = _MALLINFO2()
    return {"heap_in_use": m.uordblks, "heap_free": m.fordblks, "mmapped": m.hblkhd}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakSampler:
    """A thread that samples the resident set; at each new maximum it keeps the main thread's stack."""

    def __init__(self, interval_s: float = 0.001):
        self.interval, self.main = interval_s, threading.main_thread().ident
        self.peak, self.stack, self.stage, self.last_grad = 0, [], "", ""
        self.stages: dict = {}
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "PeakSampler":
        self.thread.start()
        return self

    def mark(self, stage: str) -> None:
        """Peaks from now on are counted to `stage` (and the whole run's)."""
        self.stage = stage
        self.stages.setdefault(stage, {"peak": 0, "stack": [], "heap": {}})

    def _run(self) -> None:
        while not self._stop.is_set():
            r = rss_bytes()
            st = self.stages.get(self.stage)
            if st is not None and r > st["peak"]:
                frame = sys._current_frames().get(self.main)
                stack = [f"{Path(s.filename).name}:{s.lineno} {s.name}: {s.line}" for s in
                         traceback.extract_stack(frame)[-8:]] if frame is not None else []
                if self.last_grad:  # inside the backward: the last parameter whose gradient was accumulated
                    stack.append(f"(backward: last gradient accumulated: {self.last_grad})")
                st["peak"], st["stack"], st["heap"] = r, stack, heap_split()
                if r > self.peak:
                    self.peak, self.stack = r, stack
            time.sleep(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="the model folder: built there when missing, reused when present "
                                                  "(default: built in a temp dir)")
    ap.add_argument("--override", action="append", default=[])
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from floors import memory_floor_gb
    from vs_trl import LR, SIZES, make_real_shape_model, model_params

    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.tasks import make_task_data
    from reinforge.trainers import rl as rl_mod
    from reinforge.trainers.rl import RLTrainer

    spec = SIZES["qwen0.5b"]
    work = Path(tempfile.mkdtemp(prefix="mem_peak_"))
    model = args.model or str(work / "model")
    if not (Path(model) / "config.json").exists():
        make_real_shape_model(Path(model), spec, args.layers)
    train = make_task_data("arithmetic", str(work / "data"), n_train=64, n_test=8, n_sft=8, seed=0)["train"]
    n_params, _, V = model_params(model)
    rows, T = spec["prompts"] * spec["n"], spec["tokens"]
    over = [f"model.path={model}", f"data.train_files=[{train}]", "data.max_prompt_length=8",
            f"rollout.max_response_length={T}", f"data.train_batch_size={spec['prompts']}", f"rollout.n={spec['n']}",
            f"actor.lr={LR}", "actor.use_kl_loss=false", f"trainer.total_steps={args.steps}",
            f"trainer.run_dir={work / 'run'}", "trainer.loggers=[]", "trainer.progress=false", "trainer.report=false",
            "reward.functions=[{name: arithmetic}]", "rollout.ignore_eos=true", *args.override]
    sampler = PeakSampler().start()
    sampler.mark("load")
    trainer = RLTrainer(load_config(RLConfig, "grpo", over))
    # stage marks: wrap the actor's update and the rollout's generate
    actor, rollout = trainer.actor if hasattr(trainer, "actor") else None, None
    step_no, step_s = [0], []
    if actor is not None:
        real_update = actor.update
        for name, p in actor.model.named_parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda _p, name=name: setattr(sampler, "last_grad", name))

        def update(batch, *a, **k):
            sampler.mark(f"step {step_no[0]} update")
            sampler.last_grad = ""
            out = real_update(batch, *a, **k)
            sampler.last_grad = ""
            sampler.mark(f"step {step_no[0]} after update")
            return out

        actor.update = update
    for i in range(1, args.steps + 1):
        step_no[0] = i
        sampler.mark(f"step {i} rollout + reward")
        trainer.step_idx += 1
        t0 = time.perf_counter()
        m = trainer.step()
        step_s.append((time.perf_counter() - t0, m.get("timing_s/gen", 0.0), m.get("timing_s/update_actor", 0.0)))
    sampler.stop()
    derived = {k: str(v) for k, v in trainer.plan.record().items()}
    held = sum(p.numel() * p.element_size() for p in actor.model.parameters()) + sum(
        t.numel() * t.element_size() for st in actor.opt.state.values() for t in st.values() if torch.is_tensor(t))
    after = rss_bytes()
    trainer.close()
    floor = memory_floor_gb(n_params, rows * (6 + T), V)
    gb = 1e9
    print(f"{n_params / 1e6:.0f}M parameters ({args.layers} layers, V = {V}), {rows} rows x {T} tokens, "
          f"{args.threads} threads, overrides {args.override or 'none'}")
    print(f"plan: micro-batch {derived.get('actor_micro_batch_size')}, checkpointing "
          f"{derived.get('gradient_checkpointing')}, autocast {derived.get('autocast')}, decode {derived.get('rollout_dtype')}")
    print(f"peak RSS {sampler.peak / gb:.2f} GB = {sampler.peak / gb / floor:.2f}x the floor {floor:.2f} GB "
          f"(16 B/param + the batch's fp32 logits)")
    print("steps (s, gen s, update s): " + "; ".join(f"{a:.1f}, {b:.1f}, {c:.1f}" for a, b, c in step_s))
    print(f"after the run: RSS {after / gb:.2f} GB, of which weights + AdamW state {held / gb:.2f} GB: "
          f"{(after - held) / gb:.2f} GB runtime, data and the allocator's freed-but-kept pages")
    for stage, st in sampler.stages.items():
        heap = ", ".join(f"{k} {v / gb:.2f}" for k, v in st["heap"].items())
        print(f"\n{stage}: peak {st['peak'] / gb:.2f} GB" + (f" (malloc, GB: {heap})" if heap else ""))
        for line in st["stack"][-5:]:
            print(f"    {line}")
    print(json.dumps({"peak_gb": sampler.peak / gb, "floor_gb": floor, "ratio": sampler.peak / gb / floor,
                      "stages_gb": {k: v["peak"] / gb for k, v in sampler.stages.items()}, "steps_s": step_s}))


if __name__ == "__main__":
    main()
