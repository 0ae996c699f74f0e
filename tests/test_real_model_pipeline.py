"""The whole pipeline on a real checkpoint: SmolLM2-135M-Instruct cut to its first 2 layers
(tests/conftest.py smollm2_tiny_folder: the real 49,152-id tokenizer, ChatML template, tied
embedding and the real weights of layers 0-1), on reasoning-gym chain_sum rows:

SFT on chat rows (only the assistant turn is trained) -> preference pairs the SFT model samples
and the reasoning_gym scorer ranks (`reinforge data pairs`) -> DPO and KTO on them; a reward
model trained on them -> PPO with the critic initialised from it; GRPO with LoRA; asynchronous
GRPO (staleness 1). Plus the stop token (`<|im_end|>`) and tied embeddings through an update and
the export. Every run is a couple of steps on a few rows; the full model's runs are in
docs/models_and_data.md ("The pipeline on SmolLM2-135M-Instruct")."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from reinforge.cli.main import main
from reinforge.config.load import load_config

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]

QUIET = ["trainer.progress=false", "trainer.loggers=[jsonl]"]


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _finite(row: dict, keys) -> None:
    for k in keys:
        assert k in row and math.isfinite(row[k]), (k, row.get(k))


@pytest.fixture(scope="module")
def rg(tmp_path_factory) -> dict:
    """chain_sum, two one-digit terms: 16 train rows (+ their chat SFT rows), 4 test rows."""
    from reinforge.data.reasoning_gym import make_reasoning_gym_data

    return make_reasoning_gym_data("chain_sum", str(tmp_path_factory.mktemp("rg")), n_train=16, n_test=4, seed=0,
                                   options={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})


@pytest.fixture(scope="module")
def tok(smollm2_tiny_folder):
    from reinforge.models.loading import load_tokenizer

    return load_tokenizer(smollm2_tiny_folder)


@pytest.fixture(scope="module")
def sft(smollm2_tiny_folder, rg, tmp_path_factory):
    """8 SFT steps (lr 1e-3, batch 8) on the 16 chat rows: the truncated model learns the reply's
    form `<answer>N</answer><|im_end|>`, enough for its samples to be right now and then."""
    from reinforge.config.sft import SFTConfig
    from reinforge.trainers.sft import SFTTrainer

    run = tmp_path_factory.mktemp("sft")
    over = {"model.path": smollm2_tiny_folder, "data.train_files": f"[{rg['sft']}]", "data.batch_size": 8,
            "optim.micro_batch_size": 8, "trainer.total_steps": 8, "optim.warmup_steps": 0, "optim.lr": 1e-3,
            "optim.lr_schedule": "constant", "trainer.run_dir": str(run)}
    trainer = SFTTrainer(load_config(SFTConfig, "sft", [f"{k}={v}" for k, v in over.items()] + QUIET))
    trainer.fit()
    return trainer, run


# ---- (a) SFT on chat rows ------------------------------------------------------------------------
def test_chat_rows_train_exactly_the_assistant_turn(rg, tok):
    """The loss mask is 1 on exactly the tokens of the assistant's content and its <|im_end|>, as
    the ChatML rendering places them: not on the default system turn, the user turn or headers."""
    from reinforge.data.sft import SFTDataset

    ds = SFTDataset(rg["sft"], tok, max_length=256)
    rows = pd.read_parquet(rg["sft"]).to_dict("records")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    for item, row in zip(ds.items, rows):
        messages = [dict(m) for m in row["messages"]]
        prompt = tok.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=False)
        full = tok.apply_chat_template(messages, tokenize=False)
        assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
        assert full == prompt + messages[1]["content"] + "<|im_end|>\n"
        p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        target = tok(messages[1]["content"] + "<|im_end|>", add_special_tokens=False)["input_ids"]
        assert item["input_ids"] == p_ids + target  # no BOS added (SmolLM2 has none), no trailing newline
        assert item["loss_mask"] == [0] * len(p_ids) + [1] * len(target)
        assert item["input_ids"][-1] == im_end == tok.eos_token_id


def test_sft_learns_and_the_tied_embedding_stays_tied_through_the_export(sft):
    """Loss falls on repeated rows; the head is still the embedding after the updates (one tensor),
    and the export has no lm_head, declares the tie and gives the trained model's logits."""
    from transformers import AutoModelForCausalLM

    trainer, run = sft
    losses = [r["train/loss"] for r in _rows(run) if "train/loss" in r]
    assert len(losses) == 8 and losses[-1] < 0.5 * losses[0], losses
    model = trainer.model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    cfg = json.loads((run / "hf" / "config.json").read_text())
    assert cfg["tie_word_embeddings"] and cfg["num_hidden_layers"] == 2
    from safetensors import safe_open

    with safe_open(str(run / "hf" / "model.safetensors"), "pt") as st:
        assert "lm_head.weight" not in set(st.keys())
    back = AutoModelForCausalLM.from_pretrained(str(run / "hf"), dtype=torch.float32)
    assert back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([[1, 4093, 198, 16267, 2, 198, 1, 520, 9531, 198]])
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids).logits, atol=1e-4, rtol=0)
    assert (run / "hf" / "chat_template.jinja").is_file()


# ---- (f) stop tokens ---------------------------------------------------------------------------
def test_rollout_stops_at_im_end_and_the_mask_covers_it(sft, rg, tok):
    """The SFT model's greedy replies end with <|im_end|> (the tokenizer's EOS, the generation
    config's and the template's end of turn): the mask is 1 through it and 0 after."""
    from reinforge.data import RLDataset
    from reinforge.trainers.validation import prompts_batch
    from reinforge.workers.rollout.lean import LeanRollout

    trainer, run = sft
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert json.loads((run / "hf" / "generation_config.json").read_text())["eos_token_id"] == im_end
    items = list(RLDataset(rg["test"], tok, max_prompt_length=96))
    rollout = LeanRollout(trainer.model, tok, max_prompt_length=96, max_response_length=16)
    assert im_end in rollout.eos_ids
    out = rollout.generate(prompts_batch(items, 0), n=1, greedy=True)
    stopped = 0
    for resp, mask, trunc in zip(out["responses"], out["response_mask"], out["truncated"]):
        ends = (resp == im_end).nonzero()
        if trunc:
            assert mask.all() and not len(ends)
            continue
        stopped += 1
        first = int(ends[0])
        assert mask[:first + 1].all() and not mask[first + 1:].any()
    assert stopped >= 1  # the trained form ends its turn


# ---- (c) DPO / KTO on pairs the model sampled and the scorer ranked ------------------------------
@pytest.fixture(scope="module")
def pairs(sft, rg, tmp_path_factory) -> Path:
    _, run = sft
    out = tmp_path_factory.mktemp("pairs")
    assert main(["data", "pairs", "--model", str(run / "hf"), "--data", rg["train"], "--reward", "reasoning_gym",
                 "--n", "8", "--max-samples", "16", "--max-prompt-length", "96", "--max-response-length", "12",
                 "--out", str(out)]) == 0
    return out


def test_pairs_are_ranked_by_the_reasoning_gym_scorer(pairs, rg):
    from reinforge.rewards.reasoning_gym import reasoning_gym_reward

    prefs = pd.read_parquet(pairs / "prefs.parquet")
    summary = json.loads((pairs / "pairs.json").read_text())
    assert len(prefs) >= 1 and summary["pairs"] == len(prefs) and summary["samples"] == 128
    rows = {r["extra_info"]["index"]: r for r in pd.read_parquet(rg["train"]).to_dict("records")}
    by_prompt = {}
    for r in rows.values():
        by_prompt.setdefault(r["prompt"][0]["content"], r)
    for p in prefs.to_dict("records"):
        assert p["prompt"].endswith("<|im_start|>assistant\n") and p["chosen"] != p["rejected"]
        row = next(r for q, r in by_prompt.items() if q in p["prompt"])
        gt, extra = row["reward_model"]["ground_truth"], row["extra_info"]
        score = lambda text: reasoning_gym_reward(p["prompt"], text, gt, extra)["score"]  # noqa: E731
        assert score(p["chosen"]) == p["chosen_score"] > p["rejected_score"] == score(p["rejected"])
    kto = pd.read_parquet(pairs / "kto.parquet")
    assert kto["label"].any() and (~kto["label"]).any()


@pytest.mark.parametrize("preset, file", [("dpo", "prefs.parquet"), ("kto", "kto.parquet")])
def test_dpo_and_kto_on_sampled_pairs(sft, pairs, tmp_path, preset, file):
    from reinforge.config.preference import DPOConfig
    from reinforge.trainers.dpo import DPOTrainer

    _, run = sft
    over = {"model.path": str(run / "hf"), "data.train_files": f"[{pairs / file}]", "data.batch_size": 2,
            "optim.micro_batch_size": 2, "trainer.total_steps": 2, "optim.warmup_steps": 0, "optim.lr": 1e-4,
            "data.max_length": 128, "data.val_fraction": 0, "trainer.run_dir": str(tmp_path / preset)}
    trainer = DPOTrainer(load_config(DPOConfig, preset, [f"{k}={v}" for k, v in over.items()] + QUIET))
    before = trainer.model.model.layers[1].mlp.down_proj.weight.detach().clone()
    trainer.fit()
    rows = [r for r in _rows(tmp_path / preset) if "loss" in r]
    assert len(rows) == 2
    _finite(rows[-1], ["loss", "grad_norm", "rewards/chosen"])
    assert rows[0]["loss"] == pytest.approx(math.log(2) if preset == "dpo" else 0.5, abs=1e-3)  # policy == reference
    assert not torch.equal(before, trainer.model.model.layers[1].mlp.down_proj.weight)


# ---- (b) reward model, then PPO with the critic from it -----------------------------------------
def test_reward_model_then_ppo_with_the_critic_from_it(sft, pairs, rg, tmp_path):
    from reinforge.config.preference import RMConfig
    from reinforge.config.schema import RLConfig
    from reinforge.models.loading import load_critic, load_reward_model
    from reinforge.trainers.rl import RLTrainer
    from reinforge.trainers.rm import RMTrainer

    _, sft_run = sft
    over = {"model.path": str(sft_run / "hf"), "data.train_files": f"[{pairs / 'prefs.parquet'}]",
            "data.batch_size": 2, "optim.micro_batch_size": 2, "trainer.total_steps": 2, "optim.warmup_steps": 0,
            "data.max_length": 128, "data.val_fraction": 0, "trainer.run_dir": str(tmp_path / "rm")}
    RMTrainer(load_config(RMConfig, "rm", [f"{k}={v}" for k, v in over.items()] + QUIET)).fit()
    _finite([r for r in _rows(tmp_path / "rm") if "loss" in r][-1], ["loss", "grad_norm"])
    rm = load_reward_model(str(tmp_path / "rm" / "hf"))
    critic = load_critic(str(tmp_path / "rm" / "hf"))
    assert torch.equal(critic.score.weight, rm.score.weight) and critic.score.bias is None  # the RM's head kept
    fresh = load_critic(str(sft_run / "hf"))  # from the policy: a new, small head, values near 0
    assert fresh.score.weight.std() < 3e-3 and not fresh.score.bias.any()
    del rm, fresh

    run = tmp_path / "ppo"
    over = {"model.path": str(sft_run / "hf"), "critic.model_path": str(tmp_path / "rm" / "hf"),
            "data.train_files": f"[{rg['train']}]", "data.val_files": f"[{rg['test']}]",
            "reward.functions": "[{name: reasoning_gym}]", "data.max_prompt_length": 96,
            "rollout.max_response_length": 12, "data.train_batch_size": 4, "trainer.total_steps": 1,
            "actor.micro_batch_size": 4, "critic.micro_batch_size": 4, "trainer.val_before_train": False,
            "trainer.run_dir": str(run), "trainer.report": False}
    trainer = RLTrainer(load_config(RLConfig, "ppo", [f"{k}={v}" for k, v in over.items()] + QUIET))
    assert torch.equal(trainer.critic.model.score.weight, critic.score.weight)
    actor0 = trainer.actor_model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    critic0 = trainer.critic.model.score.weight.detach().clone()
    trainer.fit()
    row = [r for r in _rows(run) if r["step"] == 1][0]
    _finite(row, ["actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm", "critic/score/mean"])
    assert not torch.equal(actor0, trainer.actor_model.model.layers[0].self_attn.q_proj.weight)
    assert not torch.equal(critic0, trainer.critic.model.score.weight)


# ---- (d) LoRA GRPO; (e) asynchronous GRPO -------------------------------------------------------
def _grpo(sft_run: Path, rg: dict, run: Path, **extra):
    from reinforge.config.schema import RLConfig
    from reinforge.trainers.rl import RLTrainer

    over = {"model.path": str(sft_run / "hf"), "data.train_files": f"[{rg['train']}]",
            "data.val_files": f"[{rg['test']}]", "reward.functions": "[{name: reasoning_gym}]",
            "data.max_prompt_length": 96, "rollout.max_response_length": 12, "data.train_batch_size": 2,
            "rollout.n": 4, "trainer.total_steps": 2, "actor.micro_batch_size": 8, "actor.lr": 1e-4,
            "trainer.val_before_train": False, "trainer.run_dir": str(run), "trainer.report": False, **extra}
    return RLTrainer(load_config(RLConfig, "grpo", [f"{k}={v}" for k, v in over.items()] + QUIET))


def test_lora_grpo_on_the_real_vocabulary_rolls_out_and_exports_the_adapted_model(sft, rg, tmp_path):
    """Only adapters train; the rollout decodes with them (the same greedy tokens as the merged
    export loaded fresh), and the export is the merged model (tied embedding still one tensor)."""
    from transformers import AutoModelForCausalLM

    from reinforge.trainers.validation import prompts_batch
    from reinforge.workers.rollout.lean import LeanRollout

    _, sft_run = sft
    trainer = _grpo(sft_run, rg, tmp_path / "lora", **{"model.lora_rank": 4, "model.lora_alpha": 8,
                                                        "actor.lr": 1e-2})
    model = trainer.actor_model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    trainer.fit()
    _finite(_rows(tmp_path / "lora")[-1], ["actor/pg_loss", "actor/grad_norm"])
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "lora" / "hf"), dtype=torch.float32)
    assert merged.lm_head.weight.data_ptr() == merged.model.embed_tokens.weight.data_ptr()
    base = AutoModelForCausalLM.from_pretrained(str(sft_run / "hf"), dtype=torch.float32)
    assert not torch.equal(merged.model.layers[0].self_attn.q_proj.weight, base.model.layers[0].self_attn.q_proj.weight)
    prompts = prompts_batch(trainer.val_items[:2], 0)
    got = trainer.rollout.generate(prompts, n=1, greedy=True)
    want = LeanRollout(merged, trainer.tok, max_prompt_length=96, max_response_length=12).generate(
        prompts, n=1, greedy=True)
    assert torch.equal(got["responses"] * got["response_mask"], want["responses"] * want["response_mask"])


def test_async_grpo_staleness_1_with_the_lean_engine(sft, rg, tmp_path):
    _, sft_run = sft
    trainer = _grpo(sft_run, rg, tmp_path / "async", **{"rollout.staleness": 1, "trainer.total_steps": 3})
    before = trainer.actor_model.model.layers[1].mlp.up_proj.weight.detach().clone()
    trainer.fit()
    rows = [r for r in _rows(tmp_path / "async") if r["step"] > 0]
    assert [r["rollout/staleness_max"] for r in rows] == [0, 1, 1]
    for r in rows:
        _finite(r, ["actor/pg_loss", "actor/grad_norm", "response_length/mean"])
    assert not torch.equal(before, trainer.actor_model.model.layers[1].mlp.up_proj.weight)
    assert trainer.actor_model.lm_head.weight is trainer.actor_model.model.embed_tokens.weight
