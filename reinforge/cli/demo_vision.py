"""`reinforge demo --task count_shapes [--quick] [--seed K] [--text-only] [--out DIR]`: a tiny
random-init vision-language model learns to count red shapes in pictures, SFT then GRPO, on a
2-core CPU (issue 25; docs/demo.md "The visual demo").

    1. data   the `count_shapes` task (tasks/count_shapes.py, 56-px pictures, 1-5 red shapes
              among 0-3 blue/green ones, chance 20%): SFT pairs, RL prompts, held-out test prompts
    2. model  a random-init tiny Qwen2-VL (models/vlm_tiny.py; the sizes in MODEL)
    3. sft    the demo's own SFT loop (cli/demo_vision_sft.py: SFTTrainer trains on image rows
              but has no hook to stop on a held-out metric), with the settings of
              presets/demo_count_shapes_sft.yaml, stopped at the first check (every CHECK_EVERY
              steps) whose greedy accuracy on DEV_PROMPTS RL prompts (never the held-out ones)
              reaches STOP_ACC and whose mean probability of the answer reaches STOP_PROB
              -> the base (out/sft/hf)
    4. rl     GRPO (presets/demo_count_shapes_grpo.yaml, the vision tower trained too) from the
              base, validated on the held-out prompts before its first step (= the base), every
              trainer.val_every steps and after its last

`--text-only` is the control: the same run with every picture (SFT, RL and test rows) replaced by
a blank white one of the same size, so the prompts are the same tokens but carry no information;
it must stay at chance. Every run also scores its base and final policy on the held-out prompts
with blank pictures (`blank_image` in demo_report.json).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from reinforge.cli.demo import run_rl, stage_seeds, trainer_seeds, val_metrics

TASK = {"task": "count_shapes", "options": {}, "n_train": 2000, "n_test": 200, "n_sft": 8000}
QUICK_TASK = {"n_train": 16, "n_test": 8, "n_sft": 32}
# The tiny VLM of the demo: vision tower 2 blocks of width 64, language model hidden 128, 2
# layers (0.65M parameters; benchmarks/studies/vlm_feasibility.py); every picture kept at 56 px
# (4 merged image tokens).
MODEL = {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 384,
         "vision_embed_dim": 64, "min_pixels": 56 * 56, "max_pixels": 56 * 56}
# STOP_PROB: clearly above chance (0.2) in what sampling gets right, not only in the argmax
DEV_PROMPTS, CHECK_EVERY, STOP_ACC, STOP_PROB = 200, 10, 0.4, 0.25
QUICK_SFT = ["trainer.total_steps=3", "optim.warmup_steps=0", "data.batch_size=8"]
QUICK_RL = ["trainer.total_steps=2", "data.train_batch_size=4", "rollout.n=4", "rollout.val_n=2",
            "trainer.pass_k=[1,2]", "data.max_val_samples=8", "trainer.log_samples_every=1"]


def blank_rows(rows: list[dict]) -> list[dict]:
    """The rows with every picture replaced by a white one of the same size (the control)."""
    import io

    from PIL import Image

    from reinforge.tasks.count_shapes import WHITE, png_bytes

    def blank(img: dict) -> dict:
        size = Image.open(io.BytesIO(img["bytes"])).size
        return {"bytes": png_bytes(Image.new("RGB", size, WHITE)), "path": None}

    return [{**r, "images": [blank(i) for i in r["images"]]} for r in rows]


def make_inputs(out: Path, quick: bool, seed: int, text_only: bool) -> tuple[dict, dict]:
    """Task data (blank pictures with text_only), out/data/dev.parquet (the first DEV_PROMPTS RL
    prompts) and the random tiny VLM (out/model); returns (data paths, task settings)."""
    from reinforge.data.io import load_rows, write_rows
    from reinforge.models.vlm_tiny import make_tiny_vlm
    from reinforge.tasks import make_task_data

    task = {**TASK, **stage_seeds(seed), "text_only": text_only, **(QUICK_TASK if quick else {})}
    paths = make_task_data(task["task"], str(out / "data"), n_train=task["n_train"], n_test=task["n_test"],
                           n_sft=task["n_sft"], seed=task["data_seed"], **task["options"])
    if text_only:
        for split in ("train", "test", "sft"):
            write_rows(blank_rows(load_rows(paths[split])), paths[split])
    paths["dev"] = write_rows(load_rows(paths["train"])[:DEV_PROMPTS], str(out / "data" / "dev.parquet"))
    make_tiny_vlm(str(out / "model"), seed=task["model_seed"], **MODEL)
    return paths, task


def run_sft_stage(out: Path, paths: dict, seed: int, extra: list[str]) -> tuple[Path, dict]:
    """SFT of out/model (presets/demo_count_shapes_sft.yaml + `extra`) until the stop rule;
    the base in out/sft/hf. -> (base folder, {"steps", "dev_acc", "dev_prob", "history"})."""
    import shutil

    import torch

    from reinforge.cli.demo_vision_sft import run_vision_sft
    from reinforge.config.load import load_config
    from reinforge.config.sft import SFTConfig
    from reinforge.data.io import load_rows
    from reinforge.models.loading import load_causal_lm, load_vlm_processor
    from reinforge.models.vlm_processor import save_processor

    cfg = load_config(SFTConfig, "demo_count_shapes_sft", [f"model.path={out / 'model'}", *trainer_seeds(seed), *extra])
    torch.manual_seed(cfg.trainer.seed)
    model = load_causal_lm(cfg.model.path, dtype="float32", freeze_vision_tower=cfg.model.freeze_vision_tower)
    processor = load_vlm_processor(cfg.model.path)
    result = run_vision_sft(model, processor, load_rows(paths["sft"]), load_rows(paths["dev"]), lr=cfg.optim.lr,
                            warmup_steps=cfg.optim.warmup_steps, batch_size=cfg.data.batch_size,
                            max_steps=cfg.trainer.total_steps, check_every=CHECK_EVERY, stop_acc=STOP_ACC,
                            stop_prob=STOP_PROB, seed=cfg.data.seed)
    run_dir = out / "sft"
    if run_dir.exists():
        shutil.rmtree(run_dir)  # replaces a previous demo's SFT stage
    model.save_pretrained(run_dir / "hf")
    save_processor(processor, str(run_dir / "hf"))
    (run_dir / "sft_log.json").write_text(json.dumps(result, indent=2))
    return run_dir / "hf", result


def blank_image_accuracy(folder: Path, test_file: str) -> float:
    """Greedy answer-token accuracy of the policy in `folder` on the held-out prompts with blank
    pictures (what it answers from the text alone)."""
    import torch

    from reinforge.cli.demo_vision_sft import encode_rows, greedy_accuracy
    from reinforge.data.io import load_rows
    from reinforge.models.loading import load_causal_lm, load_vlm_processor

    model = load_causal_lm(str(folder), dtype="float32", train=False)
    processor = load_vlm_processor(str(folder))
    enc, answers = encode_rows(processor, blank_rows(load_rows(test_file)))
    digits = torch.tensor([processor.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)])
    return greedy_accuracy(model, enc, answers, digits)


def format_table(report: dict) -> str:
    b, r = report["base"], report["rl"]
    lines = [f"{'metric (held-out)':<24}{'SFT base':>10}{'GRPO':>10}{'delta':>10}"]
    for k in ["acc_greedy", "acc_sampled"] + sorted(k for k in b if k.startswith("pass@")):
        if k in b and k in r:
            lines.append(f"{k:<24}{b[k]:>10.3f}{r[k]:>10.3f}{r[k] - b[k]:>+10.3f}")
    bb, rb = report["blank_image"]["base"], report["blank_image"]["rl"]
    lines.append(f"{'blank-image greedy':<24}{bb:>10.3f}{rb:>10.3f}{rb - bb:>+10.3f}")
    lines.append(f"\nSFT stopped at step {report['sft']['steps']} (dev greedy {report['sft']['dev_acc']:.3f}, "
                 f"p(answer) {report['sft']['dev_prob']:.3f})")
    lines += [f"time {stage:<17}{secs:>9.1f}s" for stage, secs in report["time_s"].items()]
    return "\n".join(lines)


def run_vision_demo(args, threads: int) -> int:
    text_only = bool(getattr(args, "text_only", False))
    name = "runs/demo_count_shapes" + ("_text_only" if text_only else "") + (f"_seed{args.seed}" if args.seed else "")
    out = Path(args.out or name)
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    t_all = t = time.perf_counter()
    cpu0 = time.process_time()
    paths, task = make_inputs(out, args.quick, args.seed, text_only)
    times["data+model"] = time.perf_counter() - t
    t = time.perf_counter()
    base, sft = run_sft_stage(out, paths, args.seed, QUICK_SFT if args.quick else [])
    times["sft"] = time.perf_counter() - t
    t = time.perf_counter()
    before, final = run_rl(out, base, paths, args.seed, QUICK_RL if args.quick else [],
                           preset="demo_count_shapes_grpo")
    times["rl"] = time.perf_counter() - t
    blank = {"base": blank_image_accuracy(base, paths["test"]),
             "rl": blank_image_accuracy(out / "grpo" / "hf", paths["test"])}
    times["total"] = time.perf_counter() - t_all
    # CPU seconds of this process (1 torch thread: the wall time it would take on a core of its
    # own; on a shared machine the wall time above is larger by the load)
    times["total_cpu"] = time.process_time() - cpu0
    report = {"task": task, "seed": args.seed, "quick": args.quick, "text_only": text_only, "torch_threads": threads,
              "base": val_metrics(before), "rl": val_metrics(final), "blank_image": blank,
              "sft": {k: sft[k] for k in ("steps", "dev_acc", "dev_prob")}, "time_s": times, "base_model": str(base),
              "rl_run_dir": str(out / "grpo"), "rl_model": str(out / "grpo" / "hf")}
    report["delta_acc_greedy"] = report["rl"]["acc_greedy"] - report["base"]["acc_greedy"]
    (out / "demo_report.json").write_text(json.dumps(report, indent=2))
    print("\n" + format_table(report))
    print(f"\nheld-out greedy accuracy (seed {args.seed}{', text only' if text_only else ''}): SFT base "
          f"{report['base']['acc_greedy']:.1%} -> GRPO {report['rl']['acc_greedy']:.1%} "
          f"({report['delta_acc_greedy'] * 100:+.1f} points; chance 20%)")
    print(f"run directory: {out}  (RL run: {out / 'grpo'}, report: {out / 'grpo' / 'report'}, "
          f"summary: {out / 'demo_report.json'})")
    return 0
