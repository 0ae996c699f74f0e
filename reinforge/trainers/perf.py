"""perf/* metrics of an RL step (veRL's names): model FLOPs utilisation and peak memory per stage.

perf/mfu = model FLOPs of the step / (step seconds x the machine's matmul peak), where
- the peak is measured once per process and dtype: the best of a few square matmuls on the
  actor's device (CPU: 1024^3, GPU: 4096^3) in the dtype the matmuls run in (bf16 under
  `model.autocast=bf16`, else the weights' dtype), so "1.0" means every stage ran at the speed
  of one large matmul;
- model FLOPs = 6 N x trained tokens + 2 N x forward-only tokens, N the model's matmul
  parameters (all parameters but an untied input embedding, which is a lookup), tokens the
  batch's real (unpadded) prompt + response tokens: generation and the old-log-prob, reference
  and value passes are forward-only, each actor/critic update epoch is forward + backward.
  Attention's own FLOPs (~ sequence length x hidden per token) and a greedy ReMax baseline are
  left out: at these lengths they are a few per cent, so MFU is slightly understated.

Peak memory per stage: `perf/cpu_rss_peak_gb/<stage>` is the process's peak resident set during
the stage (Linux: the VmHWM high-water mark, reset at each stage boundary through
/proc/self/clear_refs; elsewhere the lifetime peak), `perf/max_memory_allocated_gb/<stage>` the
CUDA allocator's peak when the actor is on a GPU; without the stage suffix, the step's peak.
"""
from __future__ import annotations

import functools
import resource
import sys
import time
from contextlib import contextmanager

import torch

from reinforge.models.forward import unwrap_peft
from reinforge.trainers.logging import Timer

GB = 1e9


def matmul_params(model) -> int:
    """Parameters that take part in matmuls: all of them, less an input embedding not tied to the head."""
    inner = unwrap_peft(model)
    n = sum(p.numel() for p in inner.parameters())
    emb, head = inner.get_input_embeddings(), inner.get_output_embeddings()
    if emb is not None and (head is None or emb.weight is not head.weight):
        n -= emb.weight.numel()
    return n


@functools.lru_cache(maxsize=None)
def matmul_peak_flops(device: str = "cpu", dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of the best of 5 square matmuls on `device` in `dtype` (after one warm-up); cached per process."""
    n = 4096 if device.startswith("cuda") else 1024
    gen = torch.Generator(device).manual_seed(0)  # its own: the training RNG stream must not move
    a, b = (torch.randn(n, n, device=device, dtype=dtype, generator=gen) for _ in range(2))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    best = float("inf")
    for i in range(6):
        sync()
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync()
        if i:
            best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def rl_step_flops(timings: dict, tokens: float, n_actor: int, n_critic: int, actor_epochs: int,
                  critic_epochs: int) -> float:
    """Model FLOPs of one RL step from which of its stages ran (the `timing_s/<stage>` keys)."""
    fwd = {"gen": n_actor, "old_log_prob": n_actor, "ref": n_actor, "values": n_critic}
    trained = {"update_actor": n_actor * actor_epochs, "update_critic": n_critic * critic_epochs}
    ran = {k.split("/", 1)[1] for k in timings if k.startswith("timing_s/")}
    return tokens * (2 * sum(n for s, n in fwd.items() if s in ran) + 6 * sum(n for s, n in trained.items() if s in ran))


class PeakMemory:
    """Peak memory of nested stages: each boundary reads the high-water mark, credits it to every
    open stage, and resets it (CUDA: the allocator's peak; CPU: the resident set's)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.key = "perf/max_memory_allocated_gb" if self.cuda else "perf/cpu_rss_peak_gb"
        self.open: list[float] = []

    def _read_and_reset(self) -> float:
        if self.cuda:
            peak = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            return peak / GB
        return _rss_high_water_gb()

    def _fold(self) -> None:
        peak = self._read_and_reset()
        self.open = [max(p, peak) for p in self.open]

    def start(self) -> None:
        self._fold()
        self.open.append(0.0)

    def stop(self) -> float:
        self._fold()
        return self.open.pop()


def _rss_high_water_gb() -> float:
    """The resident set's peak since the last call (Linux), or the process's lifetime peak."""
    try:
        with open("/proc/self/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return kb * 1024 / GB
    except (OSError, StopIteration):
        ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        return ru / GB if sys.platform == "darwin" else ru * 1024 / GB


class StageTimer(Timer):
    """`timing_s/<stage>` plus the stage's peak memory (`PeakMemory.key`/<stage>, max over repeats)."""

    def __init__(self, device: str = "cpu"):
        super().__init__()
        self.memory = PeakMemory(device)

    @contextmanager
    def __call__(self, name: str):
        self.memory.start()
        try:
            with super().__call__(name):
                yield
        finally:
            key = f"{self.memory.key}/{name}"
            self.times[key] = max(self.times.get(key, 0.0), self.memory.stop())

    def pop(self) -> dict[str, float]:
        """The stage metrics and, when any stage ran, the step's peak memory over them."""
        out = super().pop()
        peaks = [v for k, v in out.items() if k.startswith(self.memory.key + "/")]
        if peaks:
            out[self.memory.key] = max(peaks)
        return out
