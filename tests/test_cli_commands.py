"""The CLI's own commands and flags: `--help` without heavy imports, `reinforge presets`,
`reinforge config`, `--dry-run` on every training command, one step-budget key everywhere."""
from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from reinforge.cli.errors import USER_ERROR_NAMES, is_user_error
from reinforge.cli.main import TRAINERS, _load, main
from reinforge.config.load import ConfigError, config_command, list_presets, load_config
from tests.conftest import rl_overrides

pytestmark = pytest.mark.usefixtures("one_thread")


def test_help_and_presets_import_neither_torch_nor_transformers():
    """Every subcommand's --help and `reinforge presets` in a fresh interpreter: what a help
    screen costs is the imports, so none of torch, transformers, pyarrow may be among them."""
    code = """
import sys
from reinforge.cli.main import main, parse_args
names = "train sft dpo rm eval data model report presets config demo".split()
commands = [[]] + [[c] for c in names] + [["data", "make"], ["data", "gsm8k"]]
for argv in commands:
    try:
        parse_args([*argv, "--help"])
    except SystemExit as e:
        assert e.code == 0, argv
assert main(["presets"]) == 0
heavy = sorted(m for m in ("torch", "transformers", "pyarrow", "numpy") if m in sys.modules)
print("HEAVY", heavy, len(commands))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "HEAVY [] 14"


def test_user_errors_name_real_classes():
    """USER_ERROR_NAMES resolve to exception classes (a renamed one would silently turn exit 2
    into a traceback); resolution reads loaded modules only."""
    for module, name in USER_ERROR_NAMES:
        cls = getattr(importlib.import_module(module), name)
        assert isinstance(cls, type) and issubclass(cls, Exception), (module, name)
    assert is_user_error(ConfigError("x")) and not is_user_error(RuntimeError("x"))


def test_presets_lists_each_with_its_command(capsys):
    assert main(["presets"]) == 0
    lines = {line.split()[0]: line.split(None, 2)[1:] for line in capsys.readouterr().out.splitlines()}
    assert sorted(lines) == list_presets()
    for name, (command, text) in lines.items():
        assert command in TRAINERS and len(text) > 20, name
        load_config(_load(TRAINERS[command][0]), name)  # the header's command is the one whose schema reads the preset
    assert lines["grpo"][0] == "train" and lines["sft"][0] == "sft" and lines["rm_demo"][0] == "rm"
    assert config_command("dpo_ipo") == "dpo"  # its header, not only its base's


def _printed_yaml(capsys) -> tuple[str, dict]:
    out = capsys.readouterr().out
    return out.splitlines()[0], yaml.safe_load(out)


def test_config_prints_the_validated_config_and_reads_back(tiny_model_dir, arith_data, tmp_path, capsys):
    over = [f"model.path={tiny_model_dir}", f"data.train_files=[{arith_data['train']}]", "rollout.n=4",
            "data.train_batch_size=3", "data.max_prompt_length=8", "rollout.max_response_length=6"]
    assert main(["config", "--config", "grpo", *over]) == 0
    header, cfg = _printed_yaml(capsys)
    assert header.startswith("# train: resolved by reinforge config --config grpo")
    assert cfg["rollout"]["n"] == 4 and cfg["algorithm"]["adv_estimator"] == "grpo"
    assert cfg["derived"]["batch_size"] == 12 and cfg["actor"]["use_kl_loss"] is True  # derived, and from the preset
    saved = tmp_path / "mine.yaml"
    assert main(["config", "--config", "grpo", *over]) == 0
    saved.write_text(capsys.readouterr().out)
    assert main(["config", "--config", str(saved)]) == 0  # the output is a config file of its own
    assert _printed_yaml(capsys)[1] == cfg
    assert config_command(str(saved)) == "train"


def test_config_of_supervised_presets(capsys):
    assert main(["config", "--config", "sft", "--no-validate", "trainer.total_steps=7"]) == 0
    header, cfg = _printed_yaml(capsys)
    assert header.startswith("# sft: ") and cfg["trainer"]["total_steps"] == 7 and "total_steps" not in cfg["optim"]
    assert main(["config", "--command", "rm", "--no-validate"]) == 0  # the command's default preset: rm
    assert _printed_yaml(capsys)[1]["rm"]["score_eos"] is False


@pytest.mark.parametrize("argv,message", [
    (["config", "--config", "grpo"], "model.path is required (a local Hugging Face model folder) (reinforge config "
                                     "--no-validate prints the config without its checks)"),
    (["config", "--command", "train", "--config", "dpo"], "--config 'dpo' is a `reinforge dpo` config, not "
                                                          "`reinforge train`: run reinforge dpo --config dpo ..."),
    (["train", "--config", "sft"], "--config 'sft' is a `reinforge sft` config, not `reinforge train`"),
    (["sft", "--config", "sft", "optim.total_steps=3"],
     "config key 'optim.total_steps' is now 'trainer.total_steps' (the same name in every command); "
     "write trainer.total_steps=3"),
    (["dpo", "optim.epochs=2"], "config key 'optim.epochs' is now 'trainer.epochs'"),
])
def test_refused_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"reinforge: error: {message}") and err.count("\n") == 1


def test_hints_name_the_full_key(tiny_model_dir, arith_data, capsys):
    """A message names the dotted key as it is written in a config (section.field), never the
    bare field: nested unknown keys, types, ranges, cross-field rules."""
    model, prefs = f"model.path={tiny_model_dir}", f"data.train_files=[{arith_data['prefs']}]"
    cases = [
        (["config", "--no-validate", "rollout.nn=3"], "unknown config key 'rollout.nn'; did you mean 'rollout.n'?"),
        (["config", "--no-validate", "rollout.n=abc"], "config key 'rollout.n': Value 'abc' of type 'str' could not"),
        (["dpo", model, prefs, "dpo.label_smoothing=0.1", "dpo.loss_type=ipo", "--dry-run"],
         "dpo.label_smoothing=0.1 applies to dpo.loss_type=sigmoid (cDPO) or robust (rDPO), not 'ipo'"),
        (["rm", model, prefs, "trainer.total_steps=0", "trainer.epochs=0", "--dry-run"],
         "set trainer.total_steps > 0 or trainer.epochs > 0"),
        (["sft", model, f"data.train_files=[{arith_data['sft']}]", f"eval.prompt_files=[{arith_data['test']}]",
          "--dry-run"],  # the 512 + 512 defaults on the tiny model (256 positions)
         "eval.max_prompt_length + eval.max_response_length = 1024 exceeds the model's max_position_embeddings = 256"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        assert capsys.readouterr().err.startswith(f"reinforge: error: {message}"), argv


def test_old_step_key_in_a_yaml_file_names_the_new_one(tmp_path, capsys):
    f = tmp_path / "old.yaml"
    f.write_text("base: rm\noptim:\n  lr: 1.0e-4\n  total_steps: 50\n")
    assert main(["rm", "--config", str(f), "--dry-run"]) == 2
    assert "is now 'trainer.total_steps'" in capsys.readouterr().err


def _tree(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


SUPERVISED = {
    "sft": lambda d: ["--config", "sft", f"data.train_files=[{d['sft']}]", "data.max_length=16", "data.batch_size=8"],
    "dpo": lambda d: ["--config", "dpo", f"data.train_files=[{d['prefs']}]", "data.max_length=16", "data.batch_size=8"],
    "rm": lambda d: ["--config", "rm", f"data.train_files=[{d['prefs']}]", "data.max_length=16", "data.batch_size=8"],
}


@pytest.mark.parametrize("command", ["train", "sft", "dpo", "rm"])
def test_dry_run_checks_and_writes_nothing(command, tiny_model_dir, arith_data, tmp_path, capsys, no_model_loads):
    run_dir = tmp_path / "runs" / "x"
    if command == "train":
        argv = ["train", "--config", "grpo", *rl_overrides(tiny_model_dir, arith_data, str(run_dir))]
    else:
        argv = [command, *SUPERVISED[command](arith_data), f"model.path={tiny_model_dir}", f"trainer.run_dir={run_dir}"]
    before = _tree(tmp_path)
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert _tree(tmp_path) == before and not run_dir.exists()  # not even the run directory
    assert out.startswith("dry run: every check passed") and f"{_n_params(tiny_model_dir) / 1e6:.2f}M parameters" in out
    assert f"trainer.run_dir={run_dir} (will be created)" in out
    if command in ("dpo", "rm"):  # data.val_fraction=0.05 of the pairs held out, the rest in steps of 8
        from reinforge.data.io import load_rows

        n = len(load_rows(arith_data["prefs"]))
        held = max(1, int(n * 0.05))
        assert f"data.train_files: {n - held} training pairs; {(n - held) // 8} steps of 8" in out
        assert f"held-out: {held} pairs" in out
    if command == "sft":
        assert "data.train_files: 64 rows; 8 steps of 8" in out  # trainer.epochs=1 over 64 rows
    if command == "train":
        assert "data.train_files: 64 prompts" in out
        assert "2 steps of 4 prompts x 4 samples" in out and "data.val_files: 8 prompts" in out and "digit_fraction" in out
        assert "actor: micro-batch 8 of a mini-batch of 16 sequences; memory: " in out  # the plan's choices
        assert "gradient checkpointing off" in out and "log-probs: fused, " in out
    else:
        assert "gradient checkpointing off (model.gradient_checkpointing=false)" in out


def _n_params(model_dir: str) -> int:
    """The model's parameters counted on a model built from its config.json (no weights read)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    return sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir)).parameters())


def test_dry_run_refuses_a_bad_row_and_a_used_run_dir(tiny_model_dir, arith_data, tmp_path, capsys, no_model_loads):
    bad = tmp_path / "sft.jsonl"
    bad.write_text('{"prompt": "1+1=", "response": "2"}\n{"prompt": "2+2=", "response": 4}\n')
    argv = ["sft", f"model.path={tiny_model_dir}", f"data.train_files=[{bad}]", f"trainer.run_dir={tmp_path / 'r'}",
            "data.batch_size=1", "--dry-run"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == "reinforge: error: sft.jsonl: row 1: field 'response': expected a string or a list of messages, got int\n"
    used = tmp_path / "used"
    used.mkdir()
    (used / "metrics.jsonl").write_text('{"step": 1}\n')
    argv = ["train", "--config", "grpo", *rl_overrides(tiny_model_dir, arith_data, str(used)), "--dry-run"]
    assert main(argv) == 2
    assert "holds a previous run (metrics.jsonl); add --resume" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 0
    assert "no checkpoint yet: starts at step 0" in capsys.readouterr().out
