"""Every ```bash block of README.md and docs/*.md runs as written.

Each block is split into commands (`\\` continuations joined, comments dropped). Every command
is checked for characters bash or zsh would expand when left unquoted ([ ] { } * ? < >), split
with shlex as bash splits it, and, for `reinforge ...`, parsed by the real CLI parser with the
config loaded from its preset and overrides (unknown keys fail). Then each document's commands
run in order in a fresh folder: `reinforge` in-process (reinforge.cli.main.main), anything
else through bash, from a folder that links the checkout's examples/ and scripts/. Training
commands get tiny-step overrides appended (TINY: one step of a small batch, a second step for
--resume; LENGTHS only where neither the command nor its preset sets one; EVAL for `reinforge
eval`), and a model folder that cannot exist here (/models/...) is replaced by a tiny model,
as are the raw GSM8K files README converts (GSM8K). README's commands all run;
in docs/ a training command whose run directory no later command reads runs with --dry-run.
SKIP lists the commands that are checked but not run, each with its reason.

REINFORGE_DOCS_LOG=<file> writes the log: each command as written, what ran and its output.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")
ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TRAINING = ("train", "sft", "dpo", "rm")
CHECKOUT = [p.name for p in (ROOT / "examples", ROOT / "scripts") if p.is_dir()]

# (document, start of the command): why it is checked but not run.
SKIP = {
    ("README.md", "make demo"): "minutes of training; tests/test_demo_chain_sum.py runs `reinforge demo --task "
                                "chain_sum --quick`",
    ("README.md", "reinforge demo --task addition"): "minutes of training; tests/test_demo.py runs `reinforge demo "
                                                     "--quick`",
    ("README.md", "make test"): "the test suite itself",
    ("README.md", "reinforge demo --task calculator"): "minutes of training; docs/agents.md runs its stages with tiny steps",
    **{("models_and_data.md", start): "the full SmolLM2 / Gemma pipeline, minutes a stage on 2 cores; "
                                      "tests/test_real_model_pipeline.py runs each stage on the 2-layer copy"
       for start in ("reinforge sft --config sft model.path=pretrained:smollm2-135m-instruct "
                     "'data.train_files=[data/rg/",
                     "reinforge data pairs --model runs/sft/hf", "reinforge rm --config rm model.path=runs/sft/hf",
                     "reinforge train --config ppo model.path=runs/sft/hf",
                     "reinforge dpo --config dpo model.path=runs/sft/hf",
                     "reinforge dpo --config kto model.path=runs/sft/hf",
                     "reinforge train --config grpo model.path=runs/sft/hf",
                     "reinforge eval --model runs/async_grpo/hf", "reinforge eval --model pretrained:gemma3-270m",
                     "reinforge sft --config sft model.path=pretrained:gemma3-270m",
                     "reinforge train --config grpo model.path=runs/gemma_sft/hf")},
    ("agents.md", "reinforge demo --task calculator --agent"): "two GRPO stages of minutes each; "
                                                               "tests/agents/test_calculator_task.py checks the option",
    ("distributed.md", "ray start"): "starts a Ray cluster",
    ("distributed.md", "reinforge train"): "needs the Ray cluster of 2 nodes x 8 GPUs started above",
}
BASH_S = 60  # a non-reinforge command (python -c, make ...) that needs longer belongs in SKIP
STANDIN = re.compile(r"^/models/[\w.-]+$")  # a model folder of the reader's, replaced by the tiny model
MODEL_KEYS = ("model.path", "teacher.path")  # the overrides whose /models/... folder is replaced


def standin(arg: str, model: str) -> str:
    """`arg` with a /models/... folder of a MODEL_KEYS override replaced by the tiny model."""
    key, _, value = arg.partition("=")
    return f"{key}={model}" if key in MODEL_KEYS and STANDIN.match(value) else arg


TINY = {
    "train": ["trainer.total_steps=1", "data.train_batch_size=2", "rollout.n=2", "rollout.val_n=2",
              "data.max_val_samples=2", "actor.micro_batch_size=4", "critic.micro_batch_size=4"],
    "sft": ["trainer.total_steps=1", "data.batch_size=4", "optim.micro_batch_size=4", "eval.max_samples=2",
            "eval.n=2", "eval.pass_k=[1,2]"],
    "dpo": ["trainer.total_steps=1", "data.batch_size=4", "optim.micro_batch_size=4", "eval.max_samples=2",
            "data.max_val_pairs=4"],
    "rm": ["trainer.total_steps=1", "data.batch_size=4", "optim.micro_batch_size=4", "data.max_val_pairs=4"],
}
COMMON = ["trainer.val_before_train=false", "trainer.progress=false", "trainer.loggers=[jsonl]"]
EVAL = ["--max-samples", "2", "--n", "2"]  # appended to `reinforge eval` (argparse: the last value wins)
LENGTHS = {"train": ["data.max_prompt_length=96", "rollout.max_response_length=4"],
           "sft": ["eval.max_prompt_length=96", "eval.max_response_length=4"],
           "dpo": ["eval.max_prompt_length=96", "eval.max_response_length=4"], "rm": []}
# Raw GSM8K rows for README's `reinforge data gsm8k raw/...` (short, for the character tokenizer).
GSM8K = [{"question": f"{a}+{b}?", "answer": f"{a} plus {b} is {a + b}.\n#### {a + b}"} for a in range(4) for b in range(3)]


def bash_blocks(path: Path) -> list[tuple[int, str]]:
    """(first line number, text) of each ```bash block."""
    text = path.read_text(encoding="utf-8")
    return [(text[:m.start()].count("\n") + 2, m.group(1))
            for m in re.finditer(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)]


def strip_comment(line: str) -> str:
    """`line` without a shell comment (an unquoted # at the start of a word)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines dropped."""
    out, cur = [], ""
    for line in block.splitlines():
        code = strip_comment(line).strip()
        if code.endswith("\\"):
            cur += code[:-1].rstrip() + " "
            continue
        cur += code
        if cur:
            out.append(cur)
        cur = ""
    return out


def unquoted_specials(command: str) -> str:
    """Characters of `command` that bash or zsh expand or redirect on when unquoted (globs,
    braces, < >)."""
    found, quote = [], None
    for c in command:
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "[]{}*?<>":
            found.append(c)
    return "".join(found)


def all_commands() -> list[tuple[str, int, str]]:
    """(document name, block line, command) for every command of every document."""
    return [(doc.name, line, cmd) for doc in DOCS for line, block in bash_blocks(doc) for cmd in commands(block)]


def skip_reason(doc: str, command: str) -> str | None:
    return next((why for (d, start), why in SKIP.items() if d == doc and command.startswith(start)), None)


@pytest.mark.parametrize("doc,line,command", all_commands(), ids=lambda v: str(v)[:60])
def test_command_is_quoted_and_parses(doc, line, command):
    from reinforge.cli.main import TRAINERS, _load, parse_args
    from reinforge.config.load import load_config

    assert not unquoted_specials(command), (
        f"{doc}:{line}: quote the words holding {unquoted_specials(command)!r} (bash and zsh expand them): {command}")
    argv = shlex.split(command)
    if argv[0] != "reinforge":
        return
    args = parse_args(argv[1:])
    if args.command in TRAINING:
        load_config(_load(TRAINERS[args.command][0]), args.config, args.overrides)  # every key exists


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_blocks_hold_no_comments(doc):
    """A pasted `# ...` is an argument in interactive zsh (no interactive_comments), and an
    apostrophe in it opens a quote: what a command does is said in the prose instead."""
    bad = [f"{doc.name}:{line}: {text}" for line, block in bash_blocks(doc) for text in block.splitlines()
           if strip_comment(text) != text.rstrip()]
    assert not bad, "shell comments in command blocks:\n" + "\n".join(bad)


def test_quoting_checks_catch_the_old_readme_line():
    """The README's former gsm8k line: unquoted brackets and braces, split by the shell."""
    old = "reinforge train --config grpo reward.functions=[{name: math_verify}] data.train_files=[a.parquet]"
    assert unquoted_specials(old) == "[{}][]"
    assert unquoted_specials("reinforge train 'reward.functions=[{name: math_verify}]'") == ""
    assert unquoted_specials("ray start --address=<head-ip>:6379") == "<>"
    assert commands("a \\\n  'b # c' # d\n# e\n\nf") == ["a 'b # c'", "f"]


def _key(arg: str) -> str:
    return arg.split("=", 1)[0]


def keys_set(command: str, argv: list[str]) -> set[str]:
    """Dotted keys that the command line or its --config file (with its bases) sets."""
    from reinforge.cli.main import TRAINERS, parse_args
    from reinforge.config.load import _read_yaml, resolve_config_path

    def flat(d: dict, prefix: str = "") -> set[str]:
        return {k for key, v in d.items() for k in (flat(v, f"{prefix}{key}.") if isinstance(v, dict) else
                                                      {f"{prefix}{key}"})}

    config = parse_args(argv).config or TRAINERS[command][2]
    return {_key(a) for a in argv} | (flat(_read_yaml(resolve_config_path(config))) if config else set())


def runnable(doc: str, cmds: list[str], model: str) -> list[tuple[str, list[str] | None]]:
    """(command as written, argv to run or None for bash) of `doc`'s commands that run, with the
    stand-in model, tiny-step overrides and (docs/ only) --dry-run where no later command reads
    the run's folder."""
    out = []
    for i, cmd in enumerate(cmds):
        if skip_reason(doc, cmd):
            continue
        argv = shlex.split(cmd)
        if argv[0] != "reinforge":
            out.append((cmd, None))
            continue
        argv = [standin(a, model) for a in argv[1:]]
        command = argv[0]
        if command == "eval":
            argv += EVAL
        if command in TRAINING:
            own = keys_set(command, argv)
            argv += TINY[command] + COMMON + [o for o in LENGTHS[command] if _key(o) not in own]
            if "--resume" in argv:  # one step more than the run it continues
                argv.append("trainer.total_steps=2")
            run_dir = next((a.split("=", 1)[1] for a in argv if a.startswith("trainer.run_dir=")), None)
            used_later = run_dir and any(run_dir in later for later in cmds[i + 1:])
            if doc != "README.md" and not used_later and "--dry-run" not in argv:
                argv.append("--dry-run")
        out.append((cmd, argv))
    return out


def test_documents_run_as_written(tmp_path, monkeypatch, capsys):
    """README.md's commands, then each docs/ file's, in order, each document in a fresh folder."""
    from reinforge.cli.main import main
    from reinforge.models.tiny import make_tiny_model
    from reinforge.tasks import build_char_tokenizer

    model = tmp_path / "standin_model"
    make_tiny_model(build_char_tokenizer(), str(model))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    log = []
    for doc in DOCS:
        cmds = [cmd for _, block in bash_blocks(doc) for cmd in commands(block)]
        if not cmds:
            continue
        cwd = tmp_path / doc.stem
        (cwd / "raw").mkdir(parents=True)
        for split in ("train", "test"):
            (cwd / "raw" / f"gsm8k_{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in GSM8K))
        for name in CHECKOUT:  # the commands run from a checkout: examples/ etc. are there
            (cwd / name).symlink_to(ROOT / name)
        monkeypatch.chdir(cwd)
        for cmd, argv in runnable(doc.name, cmds, str(model)):
            start = time.perf_counter()
            if argv is None:
                try:
                    proc = subprocess.run(["bash", "-c", cmd], env=env, capture_output=True, text=True, timeout=BASH_S)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"{doc.name}: {cmd!r} ran past {BASH_S} s: make it quick or list it in SKIP with why")
                rc, output = proc.returncode, proc.stdout + proc.stderr
            else:
                rc = main(argv)
                captured = capsys.readouterr()
                output = captured.out + captured.err
            log.append(f"$ {cmd}\n  [{doc.name}, {time.perf_counter() - start:.1f} s; ran: "
                       f"{'bash' if argv is None else shlex.join(['reinforge', *argv])}]"
                       f"\n{output.rstrip()}\n  -> exit {rc}")
            assert rc == 0, "\n".join(log[-1:])
    if os.environ.get("REINFORGE_DOCS_LOG"):
        Path(os.environ["REINFORGE_DOCS_LOG"]).write_text("\n".join(log) + "\n")
