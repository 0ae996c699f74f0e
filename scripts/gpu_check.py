"""One GPU validation of the Ray backend with rank-side vLLM: `scripts/gpu_check.sh --mode ray-vllm`.

UNTESTED: written without access to a GPU (no run of it has been seen to pass). It checks, on
one GPU, in one process tree, with nothing downloaded:

- a randomly initialised Qwen2 of about 0.48B parameters (Qwen2.5-0.5B's layer shape: hidden
  896, 14 heads / 2 KV heads, MLP 4864; 32 layers; the character vocabulary of
  reinforge.tasks, so every sampled id decodes), written with save_pretrained in bf16;
- `trainer.backend=ray` with one rank (FSDP2 over NCCL, bf16), `rollout.backend=vllm`: the
  rank's own vLLM engine (sleep mode, external launcher, weights streamed from the shards),
  GRPO on the arithmetic task for --steps steps;
- per step: tokens/s of each stage (generation: response tokens / gen time; old log-probs,
  reference, actor update: all tokens / stage time), MFU (perf/mfu), the max and mean
  |log-prob gap| between vLLM and the trainer on the same sampled tokens, the losses; at the
  end each rank's peak GPU memory (torch's allocator: the trainer; the device's used memory
  now: vLLM asleep, its pool released).

Exits 77 (skipped) when there is no CUDA device, no vllm or no ray: nothing was checked, and
that must not read as a pass. Exits 1 when: a metric it checks was not reported; a loss, the
grad norm or a gap is not finite; the max gap exceeds --max-gap; the mean gap of a later step exceeds
max(--gap-growth x step 1's, 0.02) (vLLM generating with stale weights shows up that way:
step 1 runs before any update); |pg_loss| > 10 or kl_loss > 1; a stage without tokens/s; MFU
outside (0, 1] (gpu_lean_check.check_step, shared with the lean mode).
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

# The per-step bounds and tokens/s are the lean mode's: one definition of what a healthy GRPO step
# on a GPU looks like (this folder on the path also when the script is imported by file name).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_lean_check import check_step, stage_rates  # noqa: E402

EXIT_SKIPPED = 77  # automake's "skipped": a check that did not run is not a pass


def _gpu_memory(rank) -> dict:
    """In a rank process: its GPU memory, in GiB."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return {"torch_peak_allocated": torch.cuda.max_memory_allocated() / 2**30,
            "torch_peak_reserved": torch.cuda.max_memory_reserved() / 2**30, "device_used_now": (total - free) / 2**30}


def build_model(out: Path) -> int:
    """The random ~0.48B Qwen2 and its tokenizer in `out`; returns the parameter count."""
    import torch
    from transformers import Qwen2ForCausalLM

    from reinforge.models.tiny import tiny_qwen2_config
    from reinforge.tasks import build_char_tokenizer

    tok = build_char_tokenizer()
    config = tiny_qwen2_config(len(tok), hidden_size=896, num_layers=32, num_heads=14, num_kv_heads=2,
                               intermediate_size=4864, max_positions=1024, pad_token_id=tok.pad_token_id,
                               eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = tok.pad_token_id, tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.empty_cache()
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--max-gap", type=float, default=1.0, help="fail above this max |vLLM - trainer| log-prob")
    ap.add_argument("--gap-growth", type=float, default=3.0)
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: SKIPPED, no CUDA device; nothing was checked")
        return EXIT_SKIPPED
    try:
        import ray  # noqa: F401
        import vllm
    except ImportError as e:
        print(f"gpu_check: SKIPPED, {e.name} is not installed (pip install 'reinforge[vllm]' ray; "
              f"scripts/gpu_check.sh without --mode needs neither); nothing was checked")
        return EXIT_SKIPPED
    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.tasks import make_task_data
    from reinforge.trainers.rl import RLTrainer

    t0 = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    n_params = build_model(work / "model")
    data = make_task_data("arithmetic", str(work / "data"), n_train=512, n_test=16, n_sft=8, seed=0, digits=2)
    batch, n = 16, 8
    over = {"model.path": work / "model", "data.train_files": f"[{data['train']}]", "data.val_files": f"[{data['test']}]",
            "data.max_prompt_length": 64, "rollout.max_response_length": 256, "data.train_batch_size": batch,
            "rollout.n": n, "rollout.backend": "vllm", "rollout.gpu_memory_utilization": 0.35,
            "trainer.backend": "ray", "trainer.devices_per_node": 1, "model.dtype": "bfloat16",
            "actor.lr": 1e-4, "actor.micro_batch_size": 32, "trainer.total_steps": args.steps,
            "trainer.run_dir": work / "run", "trainer.loggers": "[jsonl]", "trainer.progress": False,
            "trainer.report": False, "trainer.val_before_train": False, "reward.functions": "[{name: exact_match}]"}
    print(f"gpu_check: {torch.cuda.get_device_name()}, vllm {vllm.__version__}, torch {torch.__version__}; "
          f"random Qwen2 with {n_params / 1e9:.3f}B parameters in {work}")
    trainer = RLTrainer(load_config(RLConfig, "grpo", [f"{k}={v}" for k, v in over.items()]))
    print(f"setup (model, Ray rank, FSDP2, vLLM engine): {time.perf_counter() - t0:.0f} s")
    print("| step | gen tok/s | old_log_prob tok/s | ref tok/s | update tok/s | MFU | gap max | gap mean | "
          "pg_loss | kl_loss | grad_norm | step s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    problems, first_gap = [], None
    for step in range(1, args.steps + 1):
        trainer.step_idx = step
        m = trainer.step()
        r = stage_rates(m, batch * n)
        problems += check_step(step, m, r, first_gap, args, cuda=True)
        get = lambda k: m.get(k, math.nan)  # noqa: E731  (a missing metric is reported by check_step)
        print(f"| {step} | {r['gen']:,.0f} | {r['old_log_prob']:,.0f} | {r['ref']:,.0f} | {r['update_actor']:,.0f} | "
              f"{get('perf/mfu'):.3f} | {get('rollout_corr/logprob_gap_max'):.4f} | "
              f"{get('rollout_corr/logprob_gap_abs_mean'):.5f} | {get('actor/pg_loss'):.4g} | "
              f"{m.get('actor/kl_loss', 0.0):.4g} | {get('actor/grad_norm'):.4g} | {m['timing_s/step']:.1f} |")
        first_gap = get("rollout_corr/logprob_gap_abs_mean") if first_gap is None else first_gap
    group = trainer.actor.group
    for rank, mem in enumerate(group.get([w.__ray_call__.remote(_gpu_memory) for w in group.ranks])):
        print(f"rank {rank} GPU memory (GiB): " + ", ".join(f"{k} {v:.2f}" for k, v in mem.items()))
    trainer.close()
    print(f"total {time.perf_counter() - t0:.0f} s")
    for p in problems:
        print(f"FAILED: {p}")
    print("OK" if not problems else "FAILED")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
