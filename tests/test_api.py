"""The Python API: `from reinforge import RLConfig, RLTrainer`, configs from presets and dicts,
reward callables and in-memory datasets; the README's example run exactly as written."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from reinforge.config.load import ConfigError
from reinforge.data import DataError

README = Path(__file__).parent.parent / "README.md"


def readme_python_block(heading: str = "## Python API") -> str:
    """The first ```python block after `heading` in README.md."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def test_import_reinforge_stays_light():
    """The CLI imports the package: neither it nor the configs may pull in torch."""
    code = ("import sys, reinforge; from reinforge import RLConfig, SFTConfig, DPOConfig; "
            "RLConfig.from_preset('grpo'); print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_from_preset_dotted_and_nested_overrides_agree():
    from reinforge import RLConfig

    dotted = RLConfig.from_preset("grpo", **{"actor.lr": 1e-6, "trainer.total_steps": 3, "data.train_files": ["a.jsonl"]})
    nested = RLConfig.from_preset("grpo", actor={"lr": 1e-6}, trainer={"total_steps": 3}, data={"train_files": ["a.jsonl"]})
    assert dotted == nested
    assert dotted.actor.lr == 1e-6 and dotted.actor.use_kl_loss  # the preset's value stays
    assert RLConfig.from_dict({"base": "grpo", "actor": {"lr": 1e-6}, "trainer.total_steps": 3,
                               "data": {"train_files": ["a.jsonl"]}}) == dotted
    with pytest.raises(ConfigError, match=r"unknown config key 'actor.lrr'; did you mean 'actor.lr'"):
        RLConfig.from_preset("grpo", actor={"lrr": 1.0})
    with pytest.raises(ConfigError, match=r"config key 'rollout.n'.*'many'"):
        RLConfig.from_dict({"rollout.n": "many"})
    with pytest.raises(ConfigError, match=r"neither a YAML file nor a preset; did you mean 'grpo'"):
        RLConfig.from_preset("grp")


def test_reward_funcs_and_rows_go_into_the_config():
    from reinforge import RLConfig
    from reinforge.rewards.registry import load_reward_fn
    from reinforge.trainers.inputs import python_inputs

    def score(prompts, completions, **kwargs):
        return [1.0] * len(completions)

    cfg = RLConfig.from_preset("grpo")
    cfg, rows = python_inputs(cfg, [score, ("format", 0.5), {"name": score, "weight": 2.0, "style": "trl"}],
                              [{"prompt": "1+1=", "ground_truth": "2"}], "val.jsonl")
    assert cfg.reward.functions == [{"name": "python:score"}, {"name": "format", "weight": 0.5},
                                    {"name": "python:score", "weight": 2.0, "style": "trl"}]
    assert load_reward_fn("python:score") is score
    assert cfg.data.train_files == ["python:train_dataset"] and cfg.data.val_files == ["val.jsonl"]
    assert rows == {"python:train_dataset": [{"prompt": "1+1=", "ground_truth": "2"}]}
    with pytest.raises(ConfigError, match=r"'python:nope' was a Python function handed to RLTrainer"):
        load_reward_fn("python:nope")
    with pytest.raises(DataError, match=r"python:eval_dataset: got a dict of \['test', 'train'\]; pass one split"):
        python_inputs(cfg, eval_dataset={"train": [], "test": []})


def test_in_memory_rows_pass_the_file_row_checks(tiny_model_dir, tmp_path):
    """A bad row fails as a file's would, naming the dataset, row and field, before a model loads."""
    from reinforge import RLConfig, RLTrainer
    from reinforge.tasks import build_char_tokenizer
    from reinforge.trainers.inputs import PromptDataset
    from reinforge.rewards.styles import ROW_KEY

    datasets = pytest.importorskip("datasets")
    rows = [{"prompt": "1+1=", "answer": "2", "level": 1}, {"prompt": "2+2=", "answer": "4", "level": 2}]
    ds = PromptDataset(datasets.Dataset.from_list(rows).to_list(), build_char_tokenizer(), name="python:train_dataset",
                       max_prompt_length=8)
    assert [it["ground_truth"] for it in ds] == ["2", "4"] and ds[1]["extra"]["level"] == 2
    assert ds[1]["extra"][ROW_KEY] == ("prompt", rows[1])  # TRL-style functions get the raw row
    cfg = RLConfig.from_preset("grpo", **{"model.path": tiny_model_dir, "trainer.run_dir": str(tmp_path / "run"),
                                          "data.max_prompt_length": 8, "rollout.max_response_length": 4})
    with pytest.raises(DataError, match=r"^python:train_dataset: row 1: field 'prompt': empty prompt"):
        RLTrainer(cfg, reward_funcs=["exact_match"], train_dataset=[rows[0], {"prompt": " ", "answer": "1"}])
    assert not (tmp_path / "run" / "config.yaml").exists()


@pytest.mark.slow
def test_readme_python_example_runs_as_written(tiny_model_dir, tmp_path, monkeypatch):
    """The README's Python block, unchanged, for its 2 steps (models/tiny is the test's tiny model)."""
    pytest.importorskip("datasets")
    (tmp_path / "models").mkdir()
    os.symlink(tiny_model_dir, tmp_path / "models" / "tiny")
    monkeypatch.chdir(tmp_path)
    code = readme_python_block()
    exec(compile(code, str(README), "exec"), {"__name__": "__main__"})
    run = tmp_path / "runs" / "python_api"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/ends_with_digit/mean" in r] == [1, 2]
    assert "reward/exact_match/mean" in rows[-1] and rows[-1]["reward/errors"] == 0
    config = (run / "config.yaml").read_text()
    assert "name: python:ends_with_digit" in config and "- python:train_dataset" in config
    assert (run / "hf" / "config.json").exists()


@pytest.mark.slow
def test_sft_and_dpo_trainers_take_rows_in_memory(tiny_model_dir, tmp_path):
    """SFTTrainer / DPOTrainer(cfg, train_dataset=..., eval_dataset=...): the rows go through
    SFTDataset / PreferenceDataset in place of a file, for one step each."""
    from reinforge import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    small = {"model.path": tiny_model_dir, "trainer.total_steps": 1, "data.batch_size": 4, "data.max_length": 16,
             "optim.micro_batch_size": 4, "trainer.progress": False, "trainer.loggers": ["jsonl"]}
    sft_rows = [{"prompt": f"{a}+{b}=", "response": str(a + b)} for a in range(3) for b in range(3)]
    cfg = SFTConfig.from_preset("sft", **small, **{"trainer.run_dir": str(tmp_path / "sft")})
    trainer = SFTTrainer(cfg, train_dataset=sft_rows, eval_dataset=sft_rows[:4])
    metrics = trainer.fit()
    assert metrics["train/tokens"] > 0 and "val/loss" in metrics
    data = trainer.cfg.data  # the resolved copy; cfg is left as it is
    assert data.train_files == ["python:train_dataset"] and data.val_files == ["python:eval_dataset"]
    pairs = [{"prompt": r["prompt"], "chosen": r["response"], "rejected": r["response"] + "0"} for r in sft_rows]
    cfg = DPOConfig.from_preset("dpo", **small, **{"trainer.run_dir": str(tmp_path / "dpo")})
    metrics = DPOTrainer(cfg, train_dataset=pairs).fit()
    assert 0 < metrics["loss"] < 1 and "val/loss" in metrics  # val: the preset's val_fraction of the rows
