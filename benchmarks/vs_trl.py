"""reinforge vs TRL's GRPOTrainer, side by side on one CPU: tokens/s, seconds per stage, ratio.

    make trl-venv                       # TRL 1.16 in .venv-trl (once; or REINFORGE_TRL_PYTHON=.../bin/python)
    python benchmarks/vs_trl.py [--sizes tiny small qwen0.5b smollm2] [--kl 0 1] [--precision fp32 bf16] [--rounds 3]
                                [--steps 6] [--threads 1] [--attn sdpa]

Both sides get the same model folder (`reinforge model --out`: tiny = 3M parameters, <= 32
response tokens; small = hidden 512 x 8 layers, 15.0M, <= 128 tokens), the same arithmetic
prompts, 4 prompts x 8 samples per optimizer step (one step per batch, one epoch), the same lr,
precision and attention kernel, sampling at temperature 1 from the full softmax, EOS suppressed on both sides
(reinforge `rollout.ignore_eos`, TRL `min_new_tokens`), so every response is exactly the
maximum length, tokens per step are equal and the tokens/s ratio is the step-time ratio. With
KL: reinforge GRPO's `actor.use_kl_loss` (k3, coef 0.04) against TRL's `beta=0.04`; without:
no reference model on either side. Precision fp32: both sides fp32; bf16: reinforge
`model.autocast=bf16`, TRL `bf16=True` (its default: autocast). Each cell alternates TRL and reinforge runs
(`--rounds` each, one process per run, warm-up step dropped) and reports the median step
of each run; the ratio is per round, so a load change on the machine hits both sides of it.

`--sizes qwen0.5b`: a Qwen2.5-0.5B-shaped model (hidden 896, 24 layers, 14 / 2 KV heads, MLP
4864, tied embeddings, random init, 494M parameters; `--layers K` for a shallower one of the same
widths) with the real 151,936-id Qwen2 vocabulary (models/vocabs.py), 4 prompts x 4 samples,
32 response tokens, no KL; its cells are `--settings`: `fp32` and `bf16` at equal settings
(TRL `bf16=False/True, gradient_checkpointing=False`; reinforge `model.autocast=none/bf16`,
`rollout.dtype=model`, `model.gradient_checkpointing=false`) and `defaults` (TRL's: bf16 autocast
and gradient checkpointing; reinforge's: no overrides, so checkpointing and the micro-batch are
the plan's choice: on a CPU checkpointing is on at this size, the micro-batch from the memory
budget). Each run's peak resident memory is read the same way for both sides, by
`/usr/bin/time -v` around the process (reinforge's side switches off perf/cpu_rss_peak_gb's
VmHWM resets, which would lower it). Before the table the benchmark
measures and prints this machine's floors at the shape (benchmarks/floors.py): bandwidth,
fp32 / bf16 matmul peaks at the decode and update shapes, and the generation, update and
memory floors they imply; `upd MFU` is 6 N x tokens / (update s x the update-shape peak of
the precision its matmuls ran in).

`--sizes smollm2`: the real SmolLM2-135M-Instruct (models/pretrained.py: 30 layers, hidden 576,
MLP 1536, 9 / 3 KV heads, tied 49,152-id embeddings; both sides load the same converted fp32
folder), chat prompts of reasoning-gym chain_sum (2-3 terms of 1-2 digits, rendered with the
model's chat template by both sides, <= 63 tokens), reward `reasoning_gym` (TRL's side restates its
extraction rule), 4 prompts x 4 samples, 64 response tokens (EOS suppressed on both sides), no
KL, the same `--settings` cells. Real shapes run `--rounds` rounds (default 1), the order of the
two sides alternating per round, and print the step ratio of each round.

Each step also records its process CPU seconds on both sides (time.process_time: the step's
own process; reinforge's reward workers, separate processes, are left out, ~0.03 s a step at
smollm2's shape): on a shared, loaded machine the CPU share a run gets moves between runs, and
the CPU-seconds ratio is the steadier comparison (`step CPU s` in the real-shape tables).

`--side reinforge ...` is the reinforge half (one process per run, prints JSON); the TRL half
is benchmarks/trl_side.py, run with .venv-trl's Python.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRL_PY = Path(os.environ.get("REINFORGE_TRL_PYTHON", ROOT / ".venv-trl" / "bin" / "python"))
"""TRL's venv Python: `make trl-venv`'s, or $REINFORGE_TRL_PYTHON (a venv built elsewhere)."""
SIZES = {"tiny": dict(hidden=None, layers=None, tokens=32, prompts=4, n=8),
         "small": dict(hidden=512, layers=8, tokens=128, prompts=4, n=8),
         "qwen0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, inter=4864, vocab="qwen2", tokens=32,
                          prompts=4, n=4),
         "smollm2": dict(pretrained="smollm2-135m-instruct", task="chain_sum", tokens=64, prompts=4, n=4)}
# smollm2's prompts: reasoning-gym chain_sum, 2-3 terms of 1-2 digits (`reinforge data reasoning-gym`)
RG_OPTIONS = {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}
BETA, LR = 0.04, 1e-5
# qwen0.5b cells: label -> (TRL bf16, TRL gradient checkpointing, reinforge overrides)
SETTINGS = {"fp32": (0, 0, ["model.autocast=none", "rollout.dtype=model", "model.gradient_checkpointing=false"]),
            "bf16": (1, 0, ["model.autocast=bf16", "rollout.dtype=model", "model.gradient_checkpointing=false"]),
            "defaults": (1, 1, [])}
STAGES = ("gen", "reward", "old_log_prob", "ref", "update")




def _lifetime_rss_peak() -> None:
    """Make perf/cpu_rss_peak_gb read VmHWM without resetting it, so the process's lifetime peak
    (what /usr/bin/time reports) is not lowered by the per-stage resets."""
    from reinforge.trainers import perf

    def read() -> float:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024 / perf.GB

    perf._rss_high_water_gb = read


def reinforge_side(args) -> dict:
    """Steps of reinforge's GRPO trainer on the benchmark's settings -> per-step stage seconds."""
    import torch

    from reinforge.config.load import load_config
    from reinforge.config.schema import RLConfig, RolloutConfig
    from reinforge.data.io import load_rows
    from reinforge.data.text import render_prompt
    from reinforge.models.loading import load_tokenizer
    from reinforge.trainers.rl import RLTrainer

    _lifetime_rss_peak()
    tok = load_tokenizer(args.model)
    longest = max(len(tok(render_prompt(r["prompt"], tok, args.train, i, "prompt"))["input_ids"])
                  for i, r in enumerate(load_rows(args.train)))
    over = [f"model.path={args.model}", f"data.train_files=[{args.train}]", f"data.max_prompt_length={longest}",
            f"rollout.max_response_length={args.max_tokens}", f"data.train_batch_size={args.prompts}",
            f"rollout.n={args.n}", f"actor.lr={LR}", f"actor.use_kl_loss={bool(args.kl[0])}",
            f"actor.kl_loss_coef={BETA}", f"trainer.total_steps={args.steps}",
            f"trainer.run_dir={tempfile.mkdtemp(prefix='vs_trl_')}", "trainer.loggers=[]", "trainer.progress=false",
            "trainer.report=false", f"reward.functions=[{{name: {args.reward}}}]", *args.override]
    if "ignore_eos" in RolloutConfig.__dataclass_fields__:
        over.append("rollout.ignore_eos=true")
    trainer = RLTrainer(load_config(RLConfig, "grpo", over))
    steps, B = [], args.prompts * args.n
    for _ in range(args.steps):
        trainer.step_idx += 1
        t0, c0 = time.perf_counter(), time.process_time()
        m = trainer.step()
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
        t = {k.split("/", 1)[1]: v for k, v in m.items() if k.startswith("timing_s/")}
        steps.append({"step": total, "cpu": cpu, "gen": t.get("gen", 0.0), "reward": t.get("reward", 0.0),
                      "old_log_prob": t.get("old_log_prob", 0.0), "ref": t.get("ref", 0.0),
                      "update": t.get("update_actor", 0.0), "tokens": m["response_length/mean"] * B,
                      "all_tokens": (m["response_length/mean"] + m.get("prompt_length/mean", 0.0)) * B,
                      **{k: v for k, v in m.items() if k.startswith(("perf/", "rollout_corr/"))}})
    derived = trainer.plan.record() if hasattr(trainer, "plan") else {}
    trainer.close()
    return {"steps": steps, "threads": torch.get_num_threads(), "derived": {k: str(v) for k, v in derived.items()}}


def _peak_rss_gb(stderr: str) -> float:
    """`Maximum resident set size (kbytes)` of /usr/bin/time -v's report, GB."""
    for line in stderr.splitlines():
        if "Maximum resident set size" in line:
            return int(line.rsplit(":", 1)[1]) * 1024 / 1e9
    return float("nan")


def run_side(side: str, model: str, train: str, tokens: int, kl: int, steps: int, threads: int, attn: str,
             prompts: int, n: int, trl_bf16: int, trl_gc: int, override: list[str], reward: str = "arithmetic") -> dict:
    """One run of one side in its own process, under /usr/bin/time -v -> its JSON plus `peak_rss_gb`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if side == "trl":
        cmd = [str(TRL_PY), str(ROOT / "benchmarks" / "trl_side.py"), "--beta", str(BETA if kl else 0.0),
               "--lr", str(LR), "--bf16", str(trl_bf16), "--gc", str(trl_gc), "--attn", attn]
    else:
        cmd = [sys.executable, __file__, "--side", "reinforge", "--kl", str(kl),
               *[a for o in [f"model.attn_implementation={attn}", *override] for a in ("--override", o)]]
    cmd += ["--model", model, "--train", train, "--steps", str(steps), "--max-tokens", str(tokens),
            "--prompts", str(prompts), "--n", str(n), "--reward", reward]
    timed = ["/usr/bin/time", "-v"] if Path("/usr/bin/time").exists() else []
    out = subprocess.run(timed + cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{side} run failed ({' '.join(cmd)}):\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["peak_rss_gb"] = _peak_rss_gb(out.stderr)
    return res


def summary(run: dict) -> dict:
    """Medians over the steps after the warm-up step: seconds per stage, tokens/s."""
    steps = run["steps"][1:]
    med = {k: statistics.median(s.get(k, 0.0) for s in steps)
           for k in ("step", "cpu", *STAGES, "tokens", "all_tokens")}
    med["tok_s"] = statistics.median(s["tokens"] / s["step"] for s in steps)
    med["steps"] = [s["step"] for s in steps]
    for k in steps[0]:
        if k.startswith(("perf/", "rollout_corr/")):
            med[k] = statistics.median(s[k] for s in steps)
    med["peak_rss_gb"] = run.get("peak_rss_gb", float("nan"))
    med["derived"] = run.get("derived", {})
    return med


def make_model(out: Path, size: str, layers: int | None = None) -> str:
    spec = SIZES[size]
    if "pretrained" in spec:  # the real checkpoint, converted once and cached (models/pretrained.py)
        from reinforge.models.pretrained import pretrained_folder

        return str(pretrained_folder(spec["pretrained"]))
    if "vocab" in spec:
        return make_real_shape_model(out / size, spec, layers or spec["layers"])
    cmd = [str(Path(sys.executable).parent / "reinforge"), "model", "--out", str(out / size)]
    if spec["hidden"]:
        cmd += ["--hidden", str(spec["hidden"]), "--layers", str(spec["layers"])]
    subprocess.run(cmd, check=True, capture_output=True)
    return str(out / size)


def make_real_shape_model(out: Path, spec: dict, layers: int) -> str:
    """A random-init Qwen2 model of `spec`'s widths with the real vocabulary, saved with its tokenizer."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from reinforge.models.vocabs import vocab_folder

    tok = AutoTokenizer.from_pretrained(vocab_folder(spec["vocab"]))
    cfg = Qwen2Config(vocab_size=151936, hidden_size=spec["hidden"], intermediate_size=spec["inter"],
                      num_hidden_layers=layers, num_attention_heads=spec["heads"],
                      num_key_value_heads=spec["kv_heads"], max_position_embeddings=32768, rope_theta=1e6,
                      rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      architectures=["Qwen2ForCausalLM"])
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = tok.pad_token_id, tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def model_params(path: str) -> tuple[int, int, int]:
    """(parameters, matmul parameters, vocabulary) of a saved Qwen2 folder, from its config alone."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(path)
    H, I, L, V = c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size
    kv = c.num_key_value_heads * (H // c.num_attention_heads)
    bias = H + 2 * kv if getattr(c, "attention_bias", True) else 0  # Qwen2's q/k/v biases; Llama has none
    layer = H * H * 2 + 2 * H * kv + 3 * H * I + 2 * H + bias  # q, o, k, v, MLP, norms
    n = V * H * (1 if c.tie_word_embeddings else 2) + L * layer + H
    return n, n - (0 if c.tie_word_embeddings else V * H), V


def fmt(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


def real_shape_inputs(work: Path, size: str, train: str, steps: int, model: str) -> tuple[str, str, int, int, int]:
    """(train file, reward, longest prompt in tokens, hidden, MLP width) of a real-shape row:
    qwen0.5b keeps the arithmetic prompts (a+b=: 5-6 Qwen2 tokens); smollm2 gets chat prompts of
    reasoning-gym chain_sum (one per prompt slot of every step, so no prompt repeats), rendered
    with the model's chat template as both sides render them."""
    from transformers import AutoConfig

    from reinforge.data.io import load_rows
    from reinforge.data.text import render_prompt
    from reinforge.models.loading import load_tokenizer

    spec, c = SIZES[size], AutoConfig.from_pretrained(model)
    if "task" not in spec:
        return train, "arithmetic", 6, c.hidden_size, c.intermediate_size
    from reinforge.data.reasoning_gym import make_reasoning_gym_data

    n_train = spec["prompts"] * (steps + 1)
    train = make_reasoning_gym_data(spec["task"], str(work / f"rg_{size}"), n_train=n_train, n_test=1, seed=0,
                                    options=RG_OPTIONS)["train"]
    tok = load_tokenizer(model)
    longest = max(len(tok(render_prompt(r["prompt"], tok, train, i, "prompt"))["input_ids"])
                  for i, r in enumerate(load_rows(train)))
    return train, "reasoning_gym", longest, c.hidden_size, c.intermediate_size


def _label(side: str, r: dict, trl_bf16: int, trl_gc: int) -> None:
    """Each run's precision label, from what the run resolved (reinforge's plan record)."""
    if side == "trl":
        r["upd_prec"] = r["gen_prec"] = "bf16" if trl_bf16 else "fp32"
        r["label"] = f"{r['upd_prec']}{' + ckpt' if trl_gc else ''}"
        return
    d = r["derived"]
    r["upd_prec"] = "bf16" if d.get("autocast") == "bf16" else "fp32"
    r["gen_prec"] = "bf16" if d.get("rollout_dtype") == "bfloat16" else "fp32"
    ckpt = " + ckpt" if str(d.get("gradient_checkpointing")).lower() == "true" else ""
    micro = f", micro {d['actor_micro_batch_size']}" if "actor_micro_batch_size" in d else ""
    r["label"] = f"{r['upd_prec']}{ckpt}, decode {r['gen_prec']}{micro}"


def real_shape(args, work: Path, train: str, size: str) -> None:
    """A real-shape row's cells: per `--settings` cell and round one run per side (never both at
    once; the order alternates per round), this machine's peaks measured before every run (the
    best is kept: on a busy machine a floor measured at a bad moment would flatter the ratios),
    then the tables; the step ratio is per round, so a load change hits both sides of it."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from floors import gen_floor_s, measure, memory_floor_gb, update_floor_s

    spec = SIZES[size]
    model = make_model(work, size, args.layers)
    train, reward, prompt_len, hidden, inter = real_shape_inputs(work, size, train, args.steps, model)
    n_params, n_mm, V = model_params(model)
    rows, T = spec["prompts"] * spec["n"], spec["tokens"]
    if args.threads:
        torch.set_num_threads(args.threads)
    upd_tokens = rows * (prompt_len + T)
    peaks: dict = {}

    def remeasure() -> None:
        for k, v in measure(hidden, inter, rows, upd_tokens).items():
            peaks[k] = max(peaks.get(k, 0.0), v)

    print(f"\n{size}: {n_params / 1e6:.0f}M parameters ({layers_of(model)} layers), vocabulary {V}, "
          f"{spec['prompts']} prompts x {spec['n']} samples x {T} response tokens (prompts <= {prompt_len} tokens, "
          f"reward {reward}), no KL, {args.rounds} round(s)", flush=True)
    results, order = {}, []
    for rnd in range(args.rounds):
        for setting in args.settings:
            trl_bf16, trl_gc, over = SETTINGS[setting]
            for side in ("trl", "reinforge") if rnd % 2 == 0 else ("reinforge", "trl"):
                remeasure()
                load = os.getloadavg()[0]
                r = summary(run_side(side, model, train, T, 0, args.steps + 1, args.threads, args.attn,
                                     spec["prompts"], spec["n"], trl_bf16, trl_gc, [*over, *args.override], reward))
                _label(side, r, trl_bf16, trl_gc)
                r["load"] = load
                results[setting, side, rnd] = r
                order.append((setting, side, rnd))
                print(f"  done: round {rnd + 1} {setting} {side} {r['label']}: steps "
                      f"{' '.join(fmt(x) for x in r['steps'])} s (process CPU {fmt(r['cpu'])} s), gen {fmt(r['gen'])}, update {fmt(r['update'])}, "
                      f"peak RSS {r['peak_rss_gb']:.2f} GB, load {load:.1f}", flush=True)
    remeasure()
    gf = {p: gen_floor_s(n_params, n_mm, rows, T, peaks, p) for p in ("fp32", "bf16")}
    uf = {p: update_floor_s(n_mm, upd_tokens, peaks, p) for p in ("fp32", "bf16")}
    mem_floor = memory_floor_gb(n_params, upd_tokens, V)
    print(f"\nfloors (best of {2 * len(args.settings) * args.rounds + 1} measurements, {args.threads or 'default'} "
          f"threads): bandwidth {peaks['bandwidth'] / 1e9:.1f} GB/s; matmul GFLOP/s at decode ({rows} x {hidden} x "
          f"{inter}) fp32 {peaks['decode_fp32'] / 1e9:.0f}, bf16 {peaks['decode_bf16'] / 1e9:.0f}; at update "
          f"({upd_tokens} x {hidden} x {inter}) fp32 {peaks['update_fp32'] / 1e9:.0f}, "
          f"bf16 {peaks['update_bf16'] / 1e9:.0f}")
    print(f"generation floor fp32 {gf['fp32']:.2f} s, bf16 {gf['bf16']:.2f} s; update floor fp32 {uf['fp32']:.2f} s, "
          f"bf16 {uf['bf16']:.2f} s; memory floor (16 B/param + the batch's fp32 logits) {mem_floor:.2f} GB")
    print("\n| setting | round | side | precision | steps s | step s | step CPU s | gen s | update s | peak RSS GB | "
          "upd MFU | gen / floor | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for setting, side, rnd in order:
        r = results[setting, side, rnd]
        tokens = r["all_tokens"] or upd_tokens  # real prompt + response tokens (TRL's rows are the same)
        mfu = 6 * n_mm * tokens / max(r["update"], 1e-9) / peaks[f"update_{r['upd_prec']}"]
        print(f"| {setting} | {rnd + 1} | {side} | {r['label']} | {' '.join(fmt(x) for x in r['steps'])} | "
              f"{fmt(r['step'])} | {fmt(r['cpu'])} | {fmt(r['gen'])} | {fmt(r['update'])} | {r['peak_rss_gb']:.2f} | {mfu:.2f} | "
              f"{r['gen'] / gf[r['gen_prec']]:.1f}x | {r['load']:.1f} |")
        corr = {k: v for k, v in r.items() if k.startswith("rollout_corr/")}
        if corr:
            print("|  |  |  | " + ", ".join(f"{k} {v:.4f}" for k, v in sorted(corr.items())) + " | | | | | | | | | |")
    print("\n| setting | step time reinforge / TRL per round | median | step CPU s reinforge / TRL per round | "
          "peak RSS reinforge / TRL | reinforge RSS / memory floor |")
    print("|---|---|---|---|---|---|")
    for setting in args.settings:
        st = [results[setting, "reinforge", i]["step"] / results[setting, "trl", i]["step"] for i in range(args.rounds)]
        rss = [results[setting, "reinforge", i]["peak_rss_gb"] / results[setting, "trl", i]["peak_rss_gb"]
               for i in range(args.rounds)]
        cpu = [results[setting, "reinforge", i]["cpu"] / max(results[setting, "trl", i]["cpu"], 1e-9)
               for i in range(args.rounds)]
        f_rss = statistics.median(results[setting, "reinforge", i]["peak_rss_gb"] for i in range(args.rounds))
        print(f"| {setting} | {' '.join(f'{x:.2f}x' for x in st)} | {statistics.median(st):.2f}x | "
              f"{' '.join(f'{x:.2f}x' for x in cpu)} | "
              f"{statistics.median(rss):.2f}x | {f_rss / mem_floor:.2f}x |", flush=True)


def real(size: str) -> bool:
    """A real-shape row (real vocabulary: qwen0.5b's shape, smollm2's checkpoint), run by real_shape."""
    return "vocab" in SIZES[size] or "pretrained" in SIZES[size]


def layers_of(path: str) -> int:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path).num_hidden_layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=list(SIZES))
    ap.add_argument("--kl", nargs="+", type=int, default=[0, 1], choices=[0, 1])
    ap.add_argument("--rounds", type=int, default=None,
                    help="alternating rounds per cell (default: 3 for tiny / small, 1 for the real shapes)")
    ap.add_argument("--steps", type=int, default=6, help="measured steps per run (after one warm-up)")
    ap.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS),
                    help="qwen0.5b's cells (one run per side each; --steps 2 is enough at that shape)")
    ap.add_argument("--layers", type=int, default=None, help="qwen0.5b with this many layers (quick profiling)")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention kernel, both sides")
    ap.add_argument("--threads", type=int, default=1,
                    help="OMP_NUM_THREADS for both sides (0: torch's default; 1 is fastest on a busy 2-core machine)")
    ap.add_argument("--reward", default="arithmetic", help=argparse.SUPPRESS)
    ap.add_argument("--override", action="append", default=[], help="extra reinforge config override")
    ap.add_argument("--side", choices=["reinforge"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--train", help=argparse.SUPPRESS)
    ap.add_argument("--max-tokens", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--prompts", type=int, default=4, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=8, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        json.dump(reinforge_side(args), sys.stdout)
        print()
        return
    if not TRL_PY.exists():
        raise SystemExit(f"{TRL_PY} not found: build TRL's venv first with `make trl-venv`")
    from reinforge.tasks import make_task_data

    work = Path(tempfile.mkdtemp(prefix="vs_trl_"))
    n_train = 8 * (max(args.steps, 2) + 1) * 4
    train = make_task_data("arithmetic", str(work / "data"), n_train=n_train, n_test=8, n_sft=8, seed=0)["train"]
    print(f"reinforge vs TRL 1.16 GRPOTrainer: one optimizer step per batch, EOS suppressed, medians of "
          f"{args.steps} steps after 1 warm-up, threads={args.threads or 'default'}, attention {args.attn}"
          f"{', overrides ' + ' '.join(args.override) if args.override else ''}; load average {os.getloadavg()[0]:.1f}",
          flush=True)
    toy = [s for s in args.sizes if not real(s)]
    if toy:
        print(f"\ntiny / small: 4 prompts x 8 samples, {args.rounds or 3} alternating rounds")
        print("\n| model | KL | precision | round | TRL s/step | reinforge s/step | TRL tok/s | reinforge tok/s | ratio | "
              "reinforge gen / old_lp / ref / update s | TRL gen / ref / update s | perf/mfu | peak RSS TRL / reinforge GB |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size in toy:
        spec = SIZES[size]
        model = make_model(work, size)
        for kl, precision in [(k, p) for k in args.kl for p in args.precision]:
            ratios = []
            for r in range(args.rounds or 3):
                runs = {}
                for side in (("trl", "reinforge") if r % 2 == 0 else ("reinforge", "trl")):
                    over = [f"model.autocast={'bf16' if precision == 'bf16' else 'none'}", *args.override]
                    runs[side] = summary(run_side(side, model, train, spec["tokens"], kl, args.steps + 1, args.threads,
                                                  args.attn, spec["prompts"], spec["n"], int(precision == "bf16"), 0,
                                                  over))
                t, f = runs["trl"], runs["reinforge"]
                ratio = f["tok_s"] / t["tok_s"]
                ratios.append(ratio)
                print(f"| {size} | {'yes' if kl else 'no'} | {precision} | {r + 1} | {fmt(t['step'])} | {fmt(f['step'])} | "
                      f"{t['tok_s']:.0f} | {f['tok_s']:.0f} | {ratio:.2f}x | "
                      f"{fmt(f['gen'])} / {fmt(f['old_log_prob'])} / {fmt(f['ref'])} / {fmt(f['update'])} | "
                      f"{fmt(t['gen'])} / {fmt(t['ref'])} / {fmt(t['update'])} | {f.get('perf/mfu', float('nan')):.3f} | "
                      f"{t['peak_rss_gb']:.2f} / {f['peak_rss_gb']:.2f} |", flush=True)
            print(f"| {size} | {'yes' if kl else 'no'} | {precision} | all | | | | | {min(ratios):.2f}-{max(ratios):.2f}x "
                  f"(median {statistics.median(ratios):.2f}x) | | | | |", flush=True)
    for size in [s for s in args.sizes if real(s)]:
        real_shape(argparse.Namespace(**{**vars(args), "rounds": args.rounds or 1}), work, train, size)


if __name__ == "__main__":
    main()
