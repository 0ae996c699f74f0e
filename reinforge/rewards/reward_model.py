"""Score prompt + response with a Hugging Face sequence-classification reward model."""

from __future__ import annotations

import torch

from reinforge.models.padding import pad
from reinforge.models.reward_head import last_token_scores


class RewardModelScorer:
    """`score(prompts, responses) -> list[float]`: the model's scalar at each sequence's last real token.

    Sequences are right-padded and scored by models.reward_head.last_token_scores, the function
    reward-model training reads its score with (explicit position ids, the last token found from
    the attention mask, never from pad ids), so a score does not depend on the batch's padding.
    """

    def __init__(self, model_path: str, tokenizer=None, device: str | torch.device = "cpu", batch_size: int = 16,
                 dtype: str = "auto"):
        from reinforge.models.loading import load_reward_model, load_tokenizer

        if tokenizer is None or isinstance(tokenizer, str):  # a path, or None: the model folder's own
            tokenizer = load_tokenizer(tokenizer or model_path)
        self.tokenizer = tokenizer
        # dtype: a model.dtype name ("auto": fp32 on CPU, bf16 on GPU); the model is frozen, in eval mode.
        self.model = load_reward_model(model_path, dtype=dtype, device=str(device))
        self.device, self.batch_size = torch.device(device), batch_size
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        if self.pad_id is None:
            raise ValueError("reward model tokenizer has neither a pad nor an eos token")
        # An RM trained to read its score at the EOS after the response (reinforge rm with
        # rm.score_eos) must see that EOS here too; decoded responses carry no special tokens.
        self.append_eos = bool(getattr(self.model.config, "reinforge_score_eos", False))
        if self.append_eos and self.tokenizer.eos_token_id is None:
            raise ValueError("reward model scores at EOS but its tokenizer has no eos token")

    @torch.no_grad()
    def score(self, prompts: list[str], responses: list[str]) -> list[float]:
        from reinforge.data.text import with_bos  # plain-text prompts get the BOS training gave them

        out: list[float] = []
        for start in range(0, len(prompts), self.batch_size):
            stop = start + self.batch_size
            texts = [p + r for p, r in zip(prompts[start:stop], responses[start:stop])]
            ids = with_bos(self.tokenizer, self.tokenizer(texts, add_special_tokens=False)["input_ids"])
            if self.append_eos:
                ids = [x + [self.tokenizer.eos_token_id] for x in ids]
            input_ids, attention_mask = (t.to(self.device) for t in pad(ids, self.pad_id))
            out.extend(last_token_scores(self.model, input_ids, attention_mask).cpu().tolist())  # (B,)
        return out
