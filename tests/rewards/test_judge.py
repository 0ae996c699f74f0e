"""The LLM judge (reward.functions entry `judge`): the verdict probability read at the last real
token whatever the padding, a judge whose preference is set by hand scores as computed by hand,
the greedy-generation mode parses its number, template errors name the key, and a GRPO step
trains with the judge as a weighted reward function."""
from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from reinforge.config.load import ConfigError, load_config
from reinforge.config.schema import JudgeConfig, RLConfig
from reinforge.trainers.plan import plan_rl
from reinforge.rewards.judge import JudgeScorer, check_template, parse_score
from reinforge.tasks import build_char_tokenizer
from reinforge.trainers.rl import RLTrainer
from tests.conftest import DIGIT_REWARD, rl_overrides

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["1+2=", "12+30=", "3=", "9+9=", "4+4="]
RESPONSES = ["3", "42 because 12+30", "", "18", "7"]
TRUTHS = ["3", "42", "3", "18", None]
ALPHA = 0.2  # the hand-set judge's logit scale
LETTERS = "abcde"  # a response ending in LETTERS[k] is judged "Y" with angle theta_k = pi * (1 - k / 4)


@pytest.fixture(scope="module")
def set_judge_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny model with every layer's output projections zeroed, so the last hidden state is
    RMSNorm(embedding of the last token). Embeddings: LETTERS[k] = cos(theta_k) e0 + sin(theta_k) e1,
    "=" = e2, "7" = e3; untied LM head, all rows 0 but Y = ALPHA e0, N = -ALPHA e0, "7" = ALPHA e2,
    EOS = ALPHA e3. So after LETTERS[k], logit_Y - logit_N = 2 ALPHA cos(theta_k) / sqrt(1/H + eps),
    and after "=" greedy decoding writes "7" then EOS."""
    tok = build_char_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.config.tie_word_embeddings = False
    E = model.model.embed_tokens.weight.detach().clone()
    W = torch.zeros_like(E)
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.data.zero_()
        layer.mlp.down_proj.weight.data.zero_()
    unit = torch.eye(E.shape[1])
    tid = tok.convert_tokens_to_ids
    for k, ch in enumerate(LETTERS):
        theta = math.pi * (1 - k / 4)
        E[tid(ch)] = math.cos(theta) * unit[0] + math.sin(theta) * unit[1]
    E[tid("=")], E[tid("7")] = unit[2], unit[3]
    W[tid("Y")], W[tid("N")], W[tid("7")], W[tid(tok.eos_token)] = ALPHA * unit[0], -ALPHA * unit[0], \
        ALPHA * unit[2], ALPHA * unit[3]
    model.model.embed_tokens.weight = torch.nn.Parameter(E)
    model.lm_head.weight = torch.nn.Parameter(W)
    out = tmp_path_factory.mktemp("set_judge")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def _judge(path: str, **kw) -> JudgeScorer:
    return JudgeScorer(JudgeConfig(model_path=path, verdicts=["Y", "N"], **kw))


def test_prob_scores_are_the_verdict_probabilities_at_any_padding(tiny_model_dir):
    judge = _judge(tiny_model_dir, batch_size=3)
    out = judge(PROMPTS, RESPONSES, TRUTHS)
    scores = [r["score"] for r in out]
    assert all(0.0 < s < 1.0 for s in scores) and len(set(scores)) == len(scores)
    for ids, r in zip(judge.encode(PROMPTS, RESPONSES, TRUTHS), out):
        with torch.no_grad():  # one unpadded sequence: P over the whole vocabulary at its last token
            p = torch.softmax(judge.model(input_ids=torch.tensor([ids])).logits[0, -1].float(), -1)
        py, pn = p[judge.yes_id].item(), p[judge.no_id].item()
        assert r["score"] == pytest.approx(py / (py + pn), abs=1e-5)
        assert r["verdict_mass"] == pytest.approx(py + pn, rel=1e-4)
    one_by_one = [_judge(tiny_model_dir, batch_size=1)([p], [r], [g])[0]["score"]
                  for p, r, g in zip(PROMPTS, RESPONSES, TRUTHS)]
    assert one_by_one == pytest.approx(scores, abs=1e-5)


def test_a_judge_set_by_hand_orders_responses_as_computed(set_judge_dir):
    judge = _judge(set_judge_dir, template="{response}", batch_size=8)
    responses = ["xxxa", "b", "yyyyyyyc", "d", "zze"]  # mixed lengths: the batch is padded
    scores = [r["score"] for r in judge(["q"] * 5, responses, ["t"] * 5)]
    eps, H = judge.model.config.rms_norm_eps, judge.model.config.hidden_size
    expected = [1 / (1 + math.exp(-2 * ALPHA * math.cos(math.pi * (1 - k / 4)) / math.sqrt(1 / H + eps)))
                for k in range(5)]
    assert scores == pytest.approx(expected, abs=1e-5)
    assert scores == sorted(scores) and scores[0] < 0.1 and scores[2] == pytest.approx(0.5) and scores[4] > 0.9


def test_generate_mode_parses_the_greedy_number(set_judge_dir, tiny_model_dir):
    judge = _judge(set_judge_dir, template="{response}=", mode="generate", max_new_tokens=4, batch_size=2)
    out = judge(["q"] * 3, ["ab", "c", "dddd"], ["t"] * 3)
    assert out == [{"score": pytest.approx(0.7), "parsed": 1.0}] * 3  # "7", then EOS
    # The random tiny judge: a score in [0, 1] each, the same batched and one by one.
    rnd = _judge(tiny_model_dir, mode="generate", max_new_tokens=6, batch_size=5)
    batched = rnd(PROMPTS, RESPONSES, TRUTHS)
    assert all(0.0 <= r["score"] <= 1.0 and r["parsed"] in (0.0, 1.0) for r in batched)
    single = [_judge(tiny_model_dir, mode="generate", max_new_tokens=6, batch_size=1)([p], [r], [g])[0]
              for p, r, g in zip(PROMPTS, RESPONSES, TRUTHS)]
    assert single == batched


def test_parse_score():
    assert parse_score("Score: 7/10", 10.0) == (0.7, True)
    assert parse_score("12", 10.0) == (1.0, True) and parse_score("-3", 10.0) == (0.0, True)
    assert parse_score("8.5", 10.0) == (pytest.approx(0.85), True)
    assert parse_score("no idea", 10.0) == (0.0, False)


@pytest.mark.parametrize("template, message", [
    ("Q: {question} A: {response}", r"unknown placeholder \{question\}; use \{prompt\}, \{response\}, \{ground_truth\}"),
    ("Q: {} A: {response}", r"unknown placeholder \{\} \(a positional placeholder\)"),
    ("Q: {prompt.x} {response}", r"unknown placeholder \{prompt.x\}"),
    ("Q: {prompt} A: {response", r"expected '\}' before end of string \(write \{\{ and \}\} for literal braces\)"),
    ("Q: {prompt} only", r"no \{response\} placeholder"),
])
def test_template_errors(template, message):
    with pytest.raises(ValueError, match=message):
        check_template(template)


def test_templates_that_pass():
    check_template("")  # the built-in template
    check_template("{{literal}} {prompt} -> {response} vs {ground_truth}")


def _cfg(tiny_model_dir, arith_data, tmp_path, **extra) -> RLConfig:
    return load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path / "run"), **extra))


@pytest.mark.parametrize("extra, message", [
    ({"reward.judge.template": "'Q: {question} A: {response}'"},
     r"reward.judge.template: unknown placeholder \{question\}"),
    ({"reward.judge.model_path": "null"}, "reward.functions names 'judge': set reward.judge.model_path"),
    ({"reward.judge.verdicts": '["Yes", "Yes"]'}, r"reward.judge.verdicts=\['Yes', 'Yes'\]: give two different"),
    ({"reward.judge.verdicts": "[Yes, No]"}, "YAML reads Yes/No/On/Off as booleans; quote the verdicts"),
    ({"reward.judge.mode": "sample"}, "reward.judge.mode='sample': prob or generate"),
    ({"reward.judge.max_length": 300}, "exceeds the judge's max_position_embeddings = 256"),
])
def test_judge_config_errors(tiny_model_dir, arith_data, tmp_path, extra, message):
    over = {"reward.functions": "[judge]", "reward.judge.model_path": tiny_model_dir, **extra}
    with pytest.raises(ConfigError, match=message):
        plan_rl(_cfg(tiny_model_dir, arith_data, tmp_path, **over))


def test_judge_path_without_the_judge_function(tiny_model_dir, arith_data, tmp_path):
    with pytest.raises(ConfigError, match="reward.judge.model_path is set but no reward.functions entry is 'judge'"):
        plan_rl(_cfg(tiny_model_dir, arith_data, tmp_path, **{"reward.judge.model_path": tiny_model_dir}))


def test_grpo_step_with_the_judge_as_a_weighted_reward(tiny_model_dir, arith_data, tmp_path):
    """The tiny model judges its own answers (verdicts Yes/No: first tokens Y and N) next to the
    digit reward; the step logs the judge's mean and verdict mass, and each sample's score is the
    weighted sum of the two functions' scores."""
    over = {"reward.functions": f"[{{name: judge, weight: 0.5}}, {{name: '{DIGIT_REWARD}'}}]",
            "reward.judge.model_path": tiny_model_dir, "trainer.total_steps": 1, "trainer.val_before_train": False,
            "data.val_files": "[]", "trainer.export_hf": False, "trainer.log_samples_every": 1}
    trainer = RLTrainer(_cfg(tiny_model_dir, arith_data, tmp_path, **over))
    trainer.fit()
    trainer.close()
    run = tmp_path / "run"
    row = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if json.loads(x)["step"] == 1][-1]
    assert 0.0 < row["reward/judge/mean"] < 1.0 and 0.0 < row["reward/judge/verdict_mass"] <= 1.0
    samples = [json.loads(x) for x in (run / "samples" / "train_step_1.jsonl").read_text().splitlines()]
    assert samples
    for s in samples:
        assert 0.0 <= s["rewards"]["judge"] <= 1.0
        assert s["score"] == pytest.approx(0.5 * s["rewards"]["judge"] + s["rewards"]["digit_fraction"], abs=1e-5)


def test_generate_mode_stops_at_the_chat_templates_turn_end(real_tok):
    """With Qwen2's real tokenizer (EOS <|endoftext|>, turns end with <|im_end|>) a generating
    judge stops at <|im_end|>: the verdict "7" is parsed, not the "3" a model writes after its
    turn. The model is a stand-in whose generate honours the stop ids it is given, as
    transformers' does."""
    from types import SimpleNamespace

    tok = real_tok("qwen2.5-0.5b")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    continuation = tok("7", add_special_tokens=False)["input_ids"] + [im_end] + \
        tok("3", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]

    def generate(input_ids, attention_mask, generation_config):
        stops = set(generation_config.eos_token_id)
        out = []
        for t in continuation[:generation_config.max_new_tokens]:
            out.append(t)
            if t in stops:
                break
        return torch.cat([input_ids, torch.tensor([out] * input_ids.shape[0])], dim=1)

    judge = object.__new__(JudgeScorer)
    judge.tok, judge.device = tok, torch.device("cpu")
    judge.cfg = JudgeConfig(model_path="unused", mode="generate", max_new_tokens=8)
    judge.model = SimpleNamespace(generate=generate)
    ids = [tok("score it:", add_special_tokens=False)["input_ids"]]
    assert judge._generate(ids) == [{"score": pytest.approx(0.7), "parsed": 1.0}]
