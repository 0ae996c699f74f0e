"""Score prompt + response with a Hugging Face sequence-classification reward model."""

from __future__ import annotations

import torch

from reinforge.models.padding import pad
from reinforge.models.forward import position_ids_from_mask


class RewardModelScorer:
    """`score(prompts, responses) -> list[float]`: the model's scalar at each sequence's last real token.

    Sequences are right-padded and given explicit position_ids (cumsum of the mask - 1), and
    the score is read from the per-position head output at the last attention-mask position,
    so it does not depend on the batch's padding. We do not rely on HF's own pooling: it
    finds "the last non-pad token" by comparing ids to pad_token_id, which is wrong whenever
    pad == eos and the response ends with eos.
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

    def _head_outputs(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Per-position scores (B, L): captured from the `score` head if the model has one."""
        position_ids = position_ids_from_mask(attention_mask)
        head = getattr(self.model, "score", None)
        if not isinstance(head, torch.nn.Module):
            # Other heads (e.g. BERT-style poolers) pool internally; right padding keeps index 0 valid.
            out = self.model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, 1)
            return out[:, :1].expand(-1, input_ids.shape[1])
        captured = {}
        hook = head.register_forward_hook(lambda mod, inp, out: captured.__setitem__("out", out))
        try:
            self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        finally:
            hook.remove()
        return captured["out"][..., 0]  # (B, L, 1) -> (B, L)

    @torch.no_grad()
    def score(self, prompts: list[str], responses: list[str]) -> list[float]:
        out: list[float] = []
        for start in range(0, len(prompts), self.batch_size):
            stop = start + self.batch_size
            texts = [p + r for p, r in zip(prompts[start:stop], responses[start:stop])]
            ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
            if self.append_eos:
                ids = [x + [self.tokenizer.eos_token_id] for x in ids]
            input_ids, attention_mask = (t.to(self.device) for t in pad(ids, self.pad_id))
            per_pos = self._head_outputs(input_ids, attention_mask)  # (B, L)
            last = attention_mask.sum(-1) - 1  # (B,) index of the last real token
            out.extend(per_pos.gather(1, last.unsqueeze(1)).squeeze(1).float().cpu().tolist())
        return out
