"""The calculator and guess_number tasks: rows, verifiers, and SFT demonstrations that are token
for token what the agent loop plays, with the observations out of the loss."""
from __future__ import annotations

import random

from reinforge.agents.tools import TOOLS
from reinforge.data.io import load_rows
from reinforge.data.sft import SFTDataset
from reinforge.tasks import build_char_tokenizer, get_task, make_task_data
from reinforge.tasks.calculator import final_answer, score_calculator
from reinforge.tasks.tags import format_tag_call, format_tag_result


def test_rows_carry_tools_and_products(tmp_path):
    paths = make_task_data("calculator", str(tmp_path), n_train=16, n_test=8, n_sft=8, seed=0)
    for row in load_rows(paths["train"]) + load_rows(paths["test"]):
        a, b = map(int, row["prompt"].rstrip("=").split("*"))
        assert 100 <= a <= 999 and 10 <= b <= 99 and row["prompt"].endswith("=")
        assert row["reward_model"]["ground_truth"] == str(a * b) and row["tools"] == ["calculator"]
    task = get_task("calculator")
    ex = task.sample(random.Random(3))
    assert score_calculator(ex.prompt, ex.answer, ex.ground_truth) == 1.0  # a plain answer counts
    assert score_calculator(ex.prompt, ex.wrong, ex.ground_truth) == 0.0


def test_verifier_reads_the_answer_after_the_tool_result():
    call = format_tag_call("calculator", "123*45")
    assert score_calculator("123*45=", call + format_tag_result("5535") + "5535", "5535") == 1.0
    # the tool's result alone is not an answer; neither is a call with nothing after it
    assert score_calculator("123*45=", call + format_tag_result("5535"), "5535") == 0.0
    assert score_calculator("123*45=", call + format_tag_result("5535") + "5536", "5535") == 0.0
    assert final_answer(call + " 5535 ") == "5535"  # the text after the call, when results are left out


def test_sft_rows_render_to_the_loop_sequence_with_observations_masked(tmp_path):
    tok = build_char_tokenizer()
    paths = make_task_data("calculator", str(tmp_path), n_train=4, n_test=4, n_sft=8, seed=1)
    rows = load_rows(paths["sft"])
    items = SFTDataset(paths["sft"], tok, max_length=128).items
    for row, item in zip(rows, items):
        prompt, product = row["prompt"][0]["content"], row["ground_truth"]
        result = TOOLS["calculator"].fn(prompt.rstrip("="))
        assert result == product

        def enc(text):
            return tok(text, add_special_tokens=False)["input_ids"]

        # what the loop sees: prompt, generated call, appended observation, generated answer + EOS
        segments = [(enc(prompt), 0), (enc(format_tag_call("calculator", prompt.rstrip("="))), 1),
                    (enc(format_tag_result(result)), 0), (enc(product) + [tok.eos_token_id], 1)]
        assert item["input_ids"] == [t for ids, _ in segments for t in ids]
        assert item["loss_mask"] == [m for ids, m in segments for _ in ids]


def test_guess_number_sft_rows_end_each_turn_with_eos(tmp_path):
    tok = build_char_tokenizer()
    paths = make_task_data("guess_number", str(tmp_path), n_train=4, n_test=4, n_sft=8, seed=0)
    train = load_rows(paths["train"])
    assert all(r["env"] == "guess_number" and r["env_kwargs"] == {"max_turns": 5} for r in train)
    assert all(1 <= int(r["reward_model"]["ground_truth"]) <= 31 for r in train)
    for item in SFTDataset(paths["sft"], tok, max_length=128).items:
        text = "".join(tok.convert_ids_to_tokens(item["input_ids"]))
        trained = "".join(t if m else "_" for t, m in zip(tok.convert_ids_to_tokens(item["input_ids"]), item["loss_mask"]))
        assert text.endswith("<eos>") and "<r>" not in trained  # observations are context
        assert trained.count("<eos>") == text.count("<eos>") <= 5  # every turn, EOS included, is a target


def test_calculator_demo_inputs_and_table(tmp_path):
    from reinforge.cli.demo_calculator import format_table, make_inputs

    paths, task = make_inputs(tmp_path, quick=True, seed=2)
    assert task["data_seed"] == 2 and (tmp_path / "model" / "config.json").exists()
    plain, sft = load_rows(paths["plain"]), load_rows(paths["sft"])
    # the no-tool baseline learns the same prompts, answered without a call
    assert [r["prompt"] for r in plain] == [r["prompt"][0]["content"] for r in sft]
    for r in plain:
        a, b = map(int, r["prompt"].rstrip("=").split("*"))
        assert r["response"] == str(a * b)
    report = {"no_tools": {"acc_greedy": 0.0}, "base": {"acc_greedy": 0.5, "acc_sampled": 0.25},
              "rl": {"acc_greedy": 0.75, "acc_sampled": 0.5}, "time_s": {"total": 1.0}}
    table = format_table(report).splitlines()
    assert table[1].split() == ["acc_greedy", "0.000", "0.500", "0.750"]
    assert table[2].split() == ["acc_sampled", "-", "0.250", "0.500"]


def test_calculator_demo_base_from_checkpoint(tmp_path):
    """The demo's base is an SFT checkpoint turned into an HF folder: its weights are the
    checkpoint's, not the final export's, and it loads with config and tokenizer."""
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reinforge.cli.demo_calculator import checkpoint_to_hf
    from reinforge.models.tiny import make_tiny_model
    from reinforge.tasks import build_char_tokenizer

    tok = build_char_tokenizer()
    make_tiny_model(tok, str(tmp_path / "final"), seed=0, hidden_size=32, intermediate_size=64, num_layers=1)
    early = make_tiny_model(tok, None, seed=1, hidden_size=32, intermediate_size=64, num_layers=1)
    (tmp_path / "ckpt").mkdir()
    save_model(early, str(tmp_path / "ckpt" / "model.safetensors"))
    out = checkpoint_to_hf(tmp_path / "ckpt", tmp_path / "final", tmp_path / "base")
    loaded = AutoModelForCausalLM.from_pretrained(out)
    for name, p in early.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], p), name
    assert AutoTokenizer.from_pretrained(out).convert_tokens_to_ids("7") == tok.convert_tokens_to_ids("7")


def test_calculator_demo_table_with_the_agent_column():
    from reinforge.cli.demo_calculator import format_table

    report = {"no_tools": {"acc_greedy": 0.0}, "base": {"acc_greedy": 0.5, "acc_sampled": 0.25},
              "rl": {"acc_greedy": 0.75, "acc_sampled": 0.5}, "time_s": {"total": 1.0},
              "agent": {"rl": {"acc_greedy": 0.7, "acc_sampled": 0.45}}}
    table = format_table(report).splitlines()
    assert table[0].split()[-3:] == ["GRPO", "+", "agent"]
    assert table[1].split() == ["acc_greedy", "0.000", "0.500", "0.750", "0.700"]


def test_demo_agent_refused_before_any_work(tmp_path, capsys):
    """--agent belongs to the calculator demo; a spec that does not load fails before the SFT."""
    import pytest

    from reinforge.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["demo", "--task", "addition", "--agent", "examples/calculator_agent.py:run", "--out", str(tmp_path)])
    assert "--task calculator" in str(e.value)
    rc = main(["demo", "--task", "calculator", "--agent", "examples/nope.py:run", "--out", str(tmp_path / "c")])
    assert rc != 0 and "rollout.agent" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
