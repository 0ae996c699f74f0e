"""Reward-model training on the tiny model: Bradley-Terry learns an easy preference to high
held-out pairwise accuracy; the export loads as a reward model, as a critic (head kept), and
scores in the RL reward scorer exactly as in training."""
from __future__ import annotations

import json
import random

import pytest
import torch

from reinforge.config.load import load_config
from reinforge.config.preference import RMConfig
from reinforge.data import write_rows
from reinforge.trainers.preference_common import pair_tensors
from reinforge.trainers.rm import RMTrainer, sequence_rewards


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: one intra-op thread


def _easy_pairs(path, n: int, seed: int) -> str:
    """Chosen answers end in '!', rejected in '?': a preference a tiny model learns in a few steps."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        ans = str(rng.randint(0, 99))
        rows.append({"prompt": f"{a}+{b}=", "chosen": ans + "!", "rejected": ans + "?"})
    return write_rows(rows, str(path))


@pytest.fixture(scope="module")
def trained_rm(one_thread, tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rm")
    train, val = _easy_pairs(tmp / "train.jsonl", 64, 0), _easy_pairs(tmp / "val.jsonl", 32, 1)
    over = {"model.path": tiny_model_dir, "data.train_files": f"[{train}]", "data.val_files": f"[{val}]",
            "data.max_length": 16, "data.batch_size": 16, "optim.micro_batch_size": 8, "trainer.total_steps": 20,
            "optim.lr": 3e-3, "optim.warmup_steps": 0, "trainer.run_dir": str(tmp / "run"), "trainer.progress": False,
            "trainer.loggers": "[jsonl]"}
    cfg = load_config(RMConfig, "rm", [f"{k}={v}" for k, v in over.items()])
    trainer = RMTrainer(cfg)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    final = trainer.fit()
    rows = [json.loads(x) for x in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    return trainer, before, final, rows, tmp / "run"


def test_rm_learns_easy_preference(trained_rm):
    trainer, before, final, rows, _ = trained_rm
    assert any(not torch.equal(v, before[k]) for k, v in trainer.model.state_dict().items())
    assert rows[0]["step"] == 0 and "val/rewards/accuracies" in rows[0]
    assert final["val/rewards/accuracies"] >= 0.95, final
    assert final["val/loss"] < rows[0]["val/loss"]
    for key in ("loss", "grad_norm", "lr", "rewards/chosen", "rewards/rejected", "rewards/margins"):
        assert key in final


def test_rm_export_loads_as_reward_model_and_critic(trained_rm):
    from reinforge.models.loading import load_critic, load_reward_model
    from reinforge.rewards import RewardModelScorer

    trainer, _, _, _, run_dir = trained_rm
    hf = str(run_dir / "hf")
    rm = load_reward_model(hf)
    assert type(rm).__name__.endswith("ForSequenceClassification") and rm.config.num_labels == 1
    assert rm.config.reinforge_score_eos is False
    critic = load_critic(hf)
    assert torch.equal(critic.score.weight, rm.score.weight)  # the critic starts from the RM's head

    # The RL reward scorer (decoded text, no EOS) gives the score the trainer optimised.
    items = [trainer.val[i] for i in range(4)]
    trainer.model.eval()
    with torch.no_grad():
        r = sequence_rewards(trainer.model, pair_tensors(items, trainer.pad_id, "cpu"), score_eos=False)
    scorer = RewardModelScorer(hf, trainer.tok)
    prompts = [it["prompt_text"] for it in items] * 2
    responses = [trainer.tok.decode(it[k][:-1]) for k in ("chosen_ids", "rejected_ids") for it in items]
    assert scorer.score(prompts, responses) == pytest.approx(r.tolist(), abs=1e-4)


def test_rm_cli_reports_bad_pair(tiny_model_dir, tmp_path, capsys):
    from reinforge.cli.main import main

    path = write_rows([{"prompt": "1+1=", "chosen": "2", "rejected": "3"}, {"prompt": "", "chosen": "2", "rejected": "3"}],
                      str(tmp_path / "prefs.parquet"))
    rc = main(["rm", f"model.path={tiny_model_dir}", f"data.train_files=[{path}]", f"trainer.run_dir={tmp_path}/r"])
    err = capsys.readouterr().err
    assert rc == 2 and "prefs.parquet: row 1: field 'prompt'" in err, err


def test_run_dir_in_use_is_refused(tmp_path):
    from reinforge.config.load import ConfigError
    from reinforge.trainers.checkpoint import lock_run_dir

    held = lock_run_dir(tmp_path)
    with pytest.raises(ConfigError, match="in use"):
        lock_run_dir(tmp_path)
    held.close()
    lock_run_dir(tmp_path).close()  # free again once the holder is gone


def test_resume_equals_uninterrupted(one_thread, tiny_model_dir, tmp_path):
    """A run stopped at step 2 and resumed in a fresh trainer ends with the same weights and
    the same last loss as one that ran straight to step 4 (model, optimizer, scheduler, data
    order and RNG all come back from the checkpoint)."""
    train = _easy_pairs(tmp_path / "train.jsonl", 32, 0)

    def trainer(run, steps):
        over = {"model.path": tiny_model_dir, "data.train_files": f"[{train}]", "data.max_length": 16,
                "data.batch_size": 8, "optim.micro_batch_size": 4, "trainer.total_steps": steps,
                "optim.lr": 1e-3, "trainer.save_every": 2, "trainer.run_dir": str(tmp_path / run),
                "trainer.progress": False, "trainer.loggers": "[jsonl]"}
        return RMTrainer(load_config(RMConfig, "rm", [f"{k}={v}" for k, v in over.items()]))

    full = trainer("full", 4)
    full.fit()
    trainer("part", 2).fit()
    resumed = trainer("part", 4)
    resumed.fit(resume=True)
    assert resumed.step_idx == 4
    for (k, a), b in zip(full.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), k
    rows = {run: [json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
            for run in ("full", "part")}
    assert rows["part"][-1]["step"] == 4 and rows["part"][-1]["loss"] == rows["full"][-1]["loss"]
