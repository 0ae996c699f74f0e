"""GPU check without Ray or vLLM: the lean rollout and FSDP2 in one process (scripts/gpu_check.sh's
default mode; `--device cpu` runs a tiny shape, and the test suite runs that: tests/test_gpu_check.py).

UNTESTED ON A GPU: written and run on CPU only (no GPU was lent to this repository when it was
written). What it runs, with nothing downloaded and no network:

- a randomly initialised Qwen2 of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads / 2 KV
  heads, MLP 4864, tied embeddings, vocabulary 151,936: 0.494B parameters) in bf16, with a
  tokenizer built here (the character tokenizer of reinforge.tasks padded to the model's
  vocabulary with `<x123>`-style filler tokens, so every sampled id decodes; its digits give the
  reward below graded values, so advantages and updates are not zero);
- the code path of `trainer.backend=ray` with one rank, but the rank is this process
  (InProcessGroup, the RayWorkerGroup interface without Ray): FSDP2 over NCCL with world size 1
  (gloo on CPU), `rollout.backend=lean` on an unsharded copy refilled from the shards after each
  update, GRPO on the arithmetic prompts for --steps steps;
- truncated importance sampling at rollout.tis_cap is switched on (the plan leaves it off for
  lean), so the actor's update reports the |log-prob gap| between the lean rollout and the
  trainer's forward on the same tokens (rollout_corr/*): both bf16, different kernels (a KV
  cache decode against a full forward), so the gap is rounding noise and the weights are ~1.

Prints per step: tokens/s of each stage (generation: response tokens / gen time; old log-probs,
reference, actor update: all tokens / stage time; 0 for a stage the plan skips), MFU against the
bf16 matmul peak measured here (perf/mfu; the peak is printed), the max and mean |log-prob gap|,
the losses; then the process's peak memory (CUDA: the allocator's peak; CPU: the peak RSS).

Exit status: 0 all bounds held; 1 a bound broke (each printed as FAILED: ...); 77 nothing was
checked (--device cuda without a CUDA device). Bounds: every loss, grad norm and gap finite; max
gap <= --max-gap; the mean gap of a later step <= max(--gap-growth x step 1's, 0.02) (a stale
rollout copy would show that way: step 1 runs before any update); |pg_loss| <= 10, kl_loss <= 1;
every stage's tokens/s > 0; on CUDA 0 < MFU <= 1.
"""
from __future__ import annotations

import argparse
import math
import resource
import sys
import tempfile
import time
from pathlib import Path

EXIT_SKIPPED = 77  # automake's "skipped": a check that did not run is not a pass

SHAPES = {  # --shape: (hidden, layers, heads, kv heads, MLP, vocabulary)
    "qwen2-0.5b": (896, 24, 14, 2, 4864, 151936),
    "tiny": (64, 2, 4, 2, 128, 512),
}

REWARD = '''def digit_fraction(prompt, response, ground_truth, **extra):
    """Fraction of the response's characters that are digits: graded for a random model."""
    return sum(c.isdigit() for c in response) / max(len(response), 1)
'''


class InProcessGroup:
    """The RayWorkerGroup interface (distributed/group.py) over one rank that is this process:
    the same RankProcess (process group, FSDP2-sharded workers, generation engine), no Ray."""

    def __init__(self, plan, builder, make_engine=None, *, threads_per_rank: int = 1):
        from reinforge.distributed.rank import RankProcess, _free_port

        self.world, self.rank = 1, RankProcess(0, 1)
        self.ranks = [self.rank]
        self.rank.setup(plan, builder, make_engine, "127.0.0.1", _free_port(), threads_per_rank)

    def run_split(self, role: str, method: str, batch, **kwargs):
        return self.rank.run(role, method, batch, kwargs)

    def run_same(self, role: str, method: str, batch, **kwargs) -> list:
        return [self.rank.run(role, method, batch, kwargs)]

    def run_all(self, role: str, method: str, *args, **kwargs) -> list:
        return [getattr(self.rank, method)(role, *args, **kwargs)]

    def generate(self, prompts, kwargs: dict, seed, version: int):
        return self.rank.generate(prompts, kwargs, seed, version)

    def shutdown(self) -> None:
        import torch.distributed as dist

        self.ranks = []
        if dist.is_initialized():
            dist.destroy_process_group()


def padded_char_tokenizer(vocab_size: int):
    """reinforge.tasks' character tokenizer with filler tokens `<x{i}>` up to `vocab_size` ids."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    from reinforge.tasks.tokenizer import CHARS, CHAT_TEMPLATE, EOS, PAD, SPECIAL_TOKENS, UNK

    symbols = SPECIAL_TOKENS + CHARS
    symbols += [f"<x{i}>" for i in range(vocab_size - len(symbols))]
    core = Tokenizer(models.BPE(vocab={s: i for i, s in enumerate(symbols)}, merges=[], unk_token=UNK))
    core.decoder = decoders.Fuse()
    core.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=EOS, unk_token=UNK,
                                   padding_side="left", chat_template=CHAT_TEMPLATE, clean_up_tokenization_spaces=False)


def build_model(out: Path, shape: str, device: str) -> int:
    """The random Qwen2 of `shape` (bf16) and its tokenizer in `out`; returns the parameter count."""
    import torch
    from transformers import Qwen2ForCausalLM

    from reinforge.models.tiny import tiny_qwen2_config

    hidden, layers, heads, kv, mlp, vocab = SHAPES[shape]
    tok = padded_char_tokenizer(vocab)
    assert len(tok) == vocab, (len(tok), vocab)
    config = tiny_qwen2_config(vocab, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv,
                               intermediate_size=mlp, max_positions=1024, pad_token_id=tok.pad_token_id,
                               eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        with torch.device(device):
            model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = tok.pad_token_id, tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    del model
    if device == "cuda":  # the fp32 build is no part of the run's peak memory
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return n


def write_prompts(folder: Path, n: int, seed: int) -> dict[str, str]:
    """Two-digit sums as veRL-schema rows in .jsonl files (parquet would need pyarrow, which the
    GPU machine may lack): train (n rows) and test (8)."""
    import random

    from reinforge.data.io import write_rows
    from reinforge.data.preprocess import rl_row

    rng, paths = random.Random(seed), {}
    for split, count in (("train", n), ("test", 8)):
        pairs = [(rng.randrange(10, 100), rng.randrange(10, 100)) for _ in range(count)]
        rows = [rl_row("arithmetic", f"{a}+{b}=", "math", str(a + b), split, i) for i, (a, b) in enumerate(pairs)]
        paths[split] = write_rows(rows, str(folder / f"{split}.jsonl"))
    return paths


def stage_rates(m: dict, rows: int) -> dict[str, float]:
    """Tokens/s per stage from a step's metrics and its batch rows (0 where the stage did not run)."""
    tokens = m["perf/throughput"] * m["timing_s/step"]  # all tokens of the batch
    out = {"gen": m["response_length/mean"] * rows / m["timing_s/gen"]}
    for stage in ("old_log_prob", "ref", "update_actor"):
        t = m.get(f"timing_s/{stage}", 0.0)
        out[stage] = tokens / t if t > 0 else 0.0
    return out


def peak_memory_gb(cuda: bool) -> tuple[str, float]:
    import torch

    if cuda:
        return "CUDA allocator peak", torch.cuda.max_memory_allocated() / 2**30
    return "peak RSS", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def check_step(step: int, m: dict, r: dict, first_gap, args, cuda: bool) -> list[str]:
    """The bounds of one step's metrics (module docstring); a missing metric is a failure too."""
    keys = ("rollout_corr/logprob_gap_max", "rollout_corr/logprob_gap_abs_mean", "actor/pg_loss", "actor/grad_norm",
            "perf/mfu")
    missing = [k for k in keys if k not in m]
    if missing:
        return [f"step {step}: metrics {missing} were not reported"]
    gap_max, gap_mean, pg, gn, mfu = (m[k] for k in keys)
    kl = m.get("actor/kl_loss", 0.0)
    out = []
    if not all(math.isfinite(v) for v in (gap_max, gap_mean, pg, kl, gn, mfu)):
        out.append(f"step {step}: a non-finite loss, grad norm, gap or MFU")
    if gap_max > args.max_gap:
        out.append(f"step {step}: max |log-prob gap| {gap_max:.4f} > --max-gap {args.max_gap}")
    if first_gap is not None and gap_mean > max(args.gap_growth * first_gap, 0.02):
        out.append(f"step {step}: mean gap {gap_mean:.5f} grew from step 1's {first_gap:.5f} "
                   f"(does the rollout generate with the updated weights?)")
    if abs(pg) > 10 or kl > 1:
        out.append(f"step {step}: loss out of bounds (pg_loss {pg:.4g}, kl_loss {kl:.4g})")
    slow = [s for s, v in r.items() if s in ("gen", "update_actor", "ref") and not v > 0]
    if slow:
        out.append(f"step {step}: no tokens/s for stages {slow}")
    if cuda and not 0 < mfu <= 1:
        out.append(f"step {step}: MFU {mfu:.3f} outside (0, 1] (a timing or FLOP-count bug)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--shape", choices=sorted(SHAPES), default=None, help="default: qwen2-0.5b on cuda, tiny on cpu")
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps (default: 4 on cuda, 2 on cpu)")
    ap.add_argument("--max-gap", type=float, default=1.0, help="fail above this max |rollout - trainer| log-prob")
    ap.add_argument("--gap-growth", type=float, default=3.0)
    args = ap.parse_args(argv)
    import torch

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("gpu_lean_check: SKIPPED, no CUDA device (--device cpu runs the tiny shape); nothing was checked")
        return EXIT_SKIPPED
    shape = args.shape or ("qwen2-0.5b" if cuda else "tiny")
    steps = args.steps or (4 if cuda else 2)
    from dataclasses import replace

    import reinforge.distributed.group as group
    import reinforge.trainers.rl as rl

    # trainer.backend=ray's code path with its one rank in this process, and the plan's TIS on so
    # the actor reports the rollout/trainer gap; put back on return (a caller's process goes on)
    ray_group, resolve = group.RayWorkerGroup, rl.resolve
    group.RayWorkerGroup = InProcessGroup
    rl.resolve = lambda *a, **k: (lambda p: replace(p, tis_cap=p.cfg.rollout.tis_cap))(resolve(*a, **k))
    try:
        return _run(args, cuda, shape, steps)
    finally:
        group.RayWorkerGroup, rl.resolve = ray_group, resolve


def _run(args, cuda: bool, shape: str, steps: int) -> int:
    import torch

    import reinforge.trainers.rl as rl
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.perf import matmul_peak_flops

    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="gpu_lean_check_"))
    n_params = build_model(work / "model", shape, args.device)
    data = write_prompts(work / "data", 256, seed=0)
    (work / "reward.py").write_text(REWARD)
    batch, n, T = (16, 8, 256) if cuda else (4, 4, 8)
    over = {"model.path": work / "model", "data.train_files": f"[{data['train']}]", "data.val_files": f"[{data['test']}]",
            "data.max_prompt_length": 32, "rollout.max_response_length": T, "data.train_batch_size": batch,
            "rollout.n": n, "rollout.backend": "lean", "trainer.backend": "ray", "trainer.devices_per_node": 1,
            "trainer.device": args.device, "model.dtype": "bfloat16", "actor.lr": 1e-4,
            "actor.micro_batch_size": 32 if cuda else 8, "trainer.total_steps": steps, "trainer.run_dir": work / "run",
            "trainer.loggers": "[jsonl]", "trainer.progress": False, "trainer.report": False,
            "trainer.val_before_train": False, "reward.functions": f"[{{name: '{work / 'reward.py'}:digit_fraction'}}]"}
    print(f"gpu_lean_check: {torch.cuda.get_device_name() if cuda else 'CPU'}, torch {torch.__version__}, "
          f"transformers {__import__('transformers').__version__}; random Qwen2 ({shape}) with "
          f"{n_params / 1e6:,.1f}M parameters in {work}")
    trainer = rl.RLTrainer(load_config(RLConfig, "grpo", [f"{k}={v}" for k, v in over.items()]))
    peak = matmul_peak_flops(args.device, torch.bfloat16)
    print(f"setup (model, process group, FSDP2, lean engine): {time.perf_counter() - t0:.1f} s; "
          f"measured bf16 matmul peak {peak / 1e12:.2f} TFLOP/s")
    print("| step | gen tok/s | old_log_prob tok/s | ref tok/s | update tok/s | MFU | gap max | gap mean | "
          "pg_loss | kl_loss | grad_norm | step s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    problems, first_gap = [], None
    try:
        for step in range(1, steps + 1):
            trainer.step_idx = step
            m = trainer.step()
            r = stage_rates(m, batch * n)
            problems += check_step(step, m, r, first_gap, args, cuda)
            get = lambda k: m.get(k, float("nan"))  # noqa: E731  (a missing metric is reported above)
            print(f"| {step} | {r['gen']:,.0f} | {r['old_log_prob']:,.0f} | {r['ref']:,.0f} | {r['update_actor']:,.0f} | "
                  f"{get('perf/mfu'):.4f} | {get('rollout_corr/logprob_gap_max'):.3g} | "
                  f"{get('rollout_corr/logprob_gap_abs_mean'):.3g} | {get('actor/pg_loss'):.4g} | "
                  f"{m.get('actor/kl_loss', 0.0):.4g} | {get('actor/grad_norm'):.4g} | {m['timing_s/step']:.2f} |")
            first_gap = get("rollout_corr/logprob_gap_abs_mean") if first_gap is None else first_gap
        what, gb = peak_memory_gb(cuda)
        print(f"peak memory ({what}): {gb:.2f} GiB")
    finally:
        trainer.close()
    print(f"total {time.perf_counter() - t0:.1f} s")
    for p in problems:
        print(f"FAILED: {p}")
    print("OK" if not problems else "FAILED")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
