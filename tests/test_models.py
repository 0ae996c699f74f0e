"""Models: RoPE-correct positions (log-probs independent of left padding), loading a saved
model + chat-template tokenizer as a user's downloaded folder, critic initialisation."""
from __future__ import annotations

import json

import pytest
import torch

from reinforge.models.forward import position_ids_from_mask, response_logprobs, response_values
from reinforge.models.loading import ModelLoadError, load_causal_lm, load_critic, load_tokenizer
from reinforge.workers.rollout.common import pad_prompts, response_mask_from_eos


def test_position_ids_from_mask():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 3]]


def test_response_mask_up_to_first_eos():
    eos = 9
    resp = torch.tensor([[1, 2, eos, 0, 0], [1, 2, 3, 4, 5], [eos, 0, 0, 0, 0]])
    mask, truncated = response_mask_from_eos(resp, [eos], torch.full((3,), 5))
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert truncated.tolist() == [False, True, False]


@pytest.mark.parametrize("fused", [True, False])
def test_logprobs_do_not_depend_on_left_padding(tiny_model_dir, fused):
    """The same prompt+response alone and left-padded beside a longer prompt: same log-probs."""
    model = load_causal_lm(tiny_model_dir, train=False)
    tok = load_tokenizer(tiny_model_dir)
    prompt, response = tok.encode("12+34="), tok.encode("46")
    longer = tok.encode("1+2+3+4+5+6+7=")
    T = len(response)
    results = []
    for prompts, P in (([prompt], len(prompt)), ([prompt, longer], 20)):
        ids, mask = pad_prompts(prompts, P, tok.pad_token_id)
        resp = torch.tensor([response] * len(prompts))
        input_ids = torch.cat([ids, resp], 1)
        attn = torch.cat([mask, torch.ones_like(resp)], 1)
        lp, ent = response_logprobs(model, input_ids, attn, T, with_entropy=True, fused=fused)
        results.append((lp[0], ent[0]))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-5)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-5)


def test_fused_and_logits_paths_agree(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, train=False)
    ids = torch.randint(3, 60, (3, 12))
    attn = torch.ones_like(ids)
    attn[0, :4] = 0
    a, ea = response_logprobs(model, ids, attn, 5, temperature=0.7, with_entropy=True, fused=True)
    b, eb = response_logprobs(model, ids, attn, 5, temperature=0.7, with_entropy=True, fused=False)
    assert torch.allclose(a, b, atol=1e-5) and torch.allclose(ea, eb, atol=1e-5)


def test_user_folder_with_chat_template_trains(tiny_model_dir, tmp_path):
    """A model saved with save_pretrained plus a tokenizer carrying a chat template, and
    veRL-schema data whose prompts are chat messages, loaded exactly as a user's folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reinforge.cli.main import main
    from tests.conftest import DIGIT_REWARD

    user = tmp_path / "my-model"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(user)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }};{% endfor %}" \
                        "{% if add_generation_prompt %}a:{% endif %}"
    tok.save_pretrained(user)
    rows = [{"data_source": "toy", "prompt": [{"role": "user", "content": f"{i}+1"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)}, "extra_info": {"index": i}}
            for i in range(8)]
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    loaded = load_tokenizer(str(user))
    assert loaded.apply_chat_template(rows[0]["prompt"], add_generation_prompt=True, tokenize=False) == "u:0+1;a:"
    rc = main(["train", "--config", "grpo", f"model.path={user}", f"data.train_files=[{data}]",
               "data.max_prompt_length=16", "rollout.max_response_length=4", "data.train_batch_size=2", "rollout.n=2",
               "trainer.total_steps=1", f"trainer.run_dir={tmp_path / 'run'}", "trainer.progress=false",
               "trainer.loggers=[jsonl]", f"reward.functions=[{{name: '{DIGIT_REWARD}'}}]", "trainer.report=false"])
    assert rc == 0
    samples = (tmp_path / "run" / "metrics.jsonl").read_text()
    assert '"step": 1' in samples


def test_critic_from_causal_lm_and_missing_folder(tiny_model_dir):
    critic = load_critic(tiny_model_dir)
    ids = torch.randint(3, 60, (2, 9))
    v = response_values(critic, ids, torch.ones_like(ids), 4)
    assert v.shape == (2, 4) and v.abs().max() < 1.0  # a small head: values start near zero
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_causal_lm("/no/such/folder")
