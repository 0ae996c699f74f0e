"""Peak memory of the driver and of each rank in a `trainer.backend=ray` GRPO run, for two model
sizes: with generation on the ranks the driver's peak should not grow with the model.

    python benchmarks/ray_memory.py                 # 3.0M and 23.7M parameters, 2 ranks
    python benchmarks/ray_memory.py --src DIR       # import reinforge from DIR (another commit's
                                                    # tree, e.g. from `git archive`) to compare

Each size runs in a fresh process (peak RSS only grows within one): 2 GRPO steps on 2 CPU ranks
(gloo), a checkpoint at each step and the HF export at the end, so weight syncs, sharded
checkpoints and the streamed `actor.safetensors` / export are all inside the measured peak.
Reported: parameters, fp32 weight bytes, the driver's peak RSS (ru_maxrss) and its growth over
the driver's RSS before the run started (imports done), and each rank's peak RSS.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SIZES = {"3.0M": dict(hidden_size=256, num_layers=4, intermediate_size=704),
         "23.7M": dict(hidden_size=512, num_layers=8, intermediate_size=1408)}


def _peak_mb(rank=None) -> float:
    """This process's peak RSS in MB (also sent to a rank with __ray_call__, which passes the actor)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(size: str, work: str) -> dict:
    """One run in this process (the child): build the model and data, train, report."""
    import ray

    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig
    from reinforge.models.tiny import make_tiny_model
    from reinforge.tasks import build_char_tokenizer, make_task_data
    from reinforge.trainers.rl import RLTrainer

    tok = build_char_tokenizer()
    model = make_tiny_model(tok, f"{work}/model", num_heads=4, num_kv_heads=2, **SIZES[size])
    n_params = sum(p.numel() for p in model.parameters())
    del model
    data = make_task_data("arithmetic", f"{work}/data", n_train=64, n_test=8, n_sft=8, seed=0, digits=1)
    over = {"model.path": f"{work}/model", "data.train_files": f"[{data['train']}]", "data.val_files": f"[{data['test']}]",
            "data.max_prompt_length": 16, "rollout.max_response_length": 16, "data.train_batch_size": 4,
            "rollout.n": 4, "trainer.total_steps": 2, "trainer.run_dir": f"{work}/run", "trainer.progress": False,
            "trainer.loggers": "[jsonl]", "trainer.report": False, "trainer.backend": "ray",
            "trainer.devices_per_node": 2, "trainer.save_every": 1, "trainer.val_before_train": False,
            "actor.micro_batch_size": 8, "reward.functions": "[{name: exact_match}]"}
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    before = _peak_mb()
    trainer = RLTrainer(load_config(RLConfig, "grpo", [f"{k}={v}" for k, v in over.items()]))
    ranks = {}
    close = trainer.close

    def close_and_measure():  # the ranks' peaks, read before the group is torn down
        group = trainer.actor.group
        ranks["mb"] = group.get([r.__ray_call__.remote(_peak_mb) for r in group.ranks])
        close()

    trainer.close = close_and_measure
    trainer.fit()
    ray.shutdown()
    return {"size": size, "params": n_params, "weights_mb": n_params * 4 / 2**20, "driver_before_mb": before,
            "driver_peak_mb": _peak_mb(), "rank_peak_mb": ranks["mb"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default=REPO, help="the tree whose reinforge package is imported")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child process: measure this size
    args = ap.parse_args()
    if args.one:
        sys.path.insert(0, os.path.abspath(args.src))
        with tempfile.TemporaryDirectory() as work:
            print(json.dumps(measure(args.one, work)))
        return
    env = {**os.environ, "PYTHONPATH": os.path.abspath(args.src), "OMP_NUM_THREADS": "1"}
    rows = []
    for size in SIZES:
        out = subprocess.run([sys.executable, __file__, "--one", size, "--src", args.src], env=env, check=True,
                             capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    print("| model | params | fp32 weights (MB) | driver before run (MB) | driver peak (MB) | driver growth (MB) "
          "| rank peaks (MB) |\n|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['size']} | {r['params']:,} | {r['weights_mb']:.1f} | {r['driver_before_mb']:.0f} | "
              f"{r['driver_peak_mb']:.0f} | {r['driver_peak_mb'] - r['driver_before_mb']:.0f} | "
              f"{', '.join(f'{x:.0f}' for x in r['rank_peak_mb'])} |")


if __name__ == "__main__":
    main()
