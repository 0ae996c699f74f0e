"""The one place a reward model's score is read: its head at each sequence's last scored token.

Reward-model training (trainers/rm.py) and scoring (rewards/reward_model.py) both call
`last_token_scores`, so the token the loss trained and the token the RL scorer reads cannot
drift apart. The token is found from the attention mask, never from pad ids: HF's own pooling
compares ids to pad_token_id, which is wrong whenever pad == eos and a row ends with its eos.
"""
from __future__ import annotations

import torch

from reinforge.models.forward import position_ids_from_mask


def last_token_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                      skip_last: int = 0, vision: list | None = None) -> torch.Tensor:
    """The scalar score of each row: (B, L) ids and 0/1 mask -> (B,) float32. Rows may be
    right-padded (training) or left-padded; a row's real tokens are contiguous.

    `model` is a one-label `<Arch>ForSequenceClassification` (or a VLM's reward model,
    models/vlm_critic.VisionValueModel); its backbone runs with explicit position ids (cumsum
    of the mask - 1), so a row's score does not depend on its batch's padding, and the `score`
    head runs on one hidden state per row: the last real token's, or the one `skip_last` tokens
    before it (rows that end with an EOS the model is not scored at). vision: the rows'
    PromptImages (or None) of a VLM: the image features go into the prompts' placeholders and
    the positions are M-RoPE's (models/vlm_forward.image_inputs, as the actor's and the critic's
    forwards build them). Gradients flow (training); scorers wrap the call in no_grad.
    """
    head = getattr(model, "score", None)
    if not isinstance(head, torch.nn.Module):
        # Other heads (e.g. BERT-style poolers) pool internally; right padding keeps index 0 valid.
        if skip_last:
            raise ValueError(f"{type(model).__name__} pools internally: it cannot score {skip_last} token(s) early")
        return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, 0].float()
    fwd = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask))
    if vision is not None and any(v is not None for v in vision):
        from reinforge.models.vlm_forward import image_embeds, image_inputs

        fwd["position_ids"], fwd["image_slots"], images = image_inputs(model, input_ids, attention_mask, vision)
        fwd = image_embeds(model, fwd, images)
    hidden = model.base_model(**fwd, use_cache=False).last_hidden_state  # (B, L, H)
    L = attention_mask.shape[1]
    # the last real token of each row, whichever side its padding is on
    last = L - 1 - attention_mask.long().flip(-1).argmax(-1) - skip_last  # (B,)
    h = hidden[torch.arange(len(input_ids), device=input_ids.device), last]  # (B, H)
    return head(h).squeeze(-1).float()
