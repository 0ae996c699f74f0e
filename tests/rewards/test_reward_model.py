"""RewardModelScorer reads the score at the last real token, whatever the batch padding."""

import pytest
import torch
from transformers import AutoModelForSequenceClassification, Qwen2Config

from reinforge.rewards import RewardModelScorer
from reinforge.tasks import build_char_tokenizer


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    tok = build_char_tokenizer()
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, num_labels=1,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(cfg)
    path = tmp_path_factory.mktemp("rm")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_scores_match_unbatched_forward(rm_dir):
    scorer = RewardModelScorer(rm_dir, None, device="cpu", batch_size=3)
    prompts, responses = ["1+1=", "12+30=", "3=", "9+9="], ["2", "42<eos>", "3", "18"]
    scores = scorer.score(prompts, responses)
    assert len(scores) == 4 and all(isinstance(s, float) for s in scores)
    for p, r, s in zip(prompts, responses, scores):
        ids = torch.tensor([scorer.tokenizer(p + r)["input_ids"]])
        with torch.no_grad():  # one sequence, no padding: the last position is the real last token
            hidden = scorer.model.model(input_ids=ids).last_hidden_state
            expected = scorer.model.score(hidden)[0, -1, 0].item()
        assert s == pytest.approx(expected, abs=1e-5)
    # Alone or in a batch with longer sequences: the same score.
    assert scorer.score(prompts[:1], responses[:1])[0] == pytest.approx(scores[0], abs=1e-5)
