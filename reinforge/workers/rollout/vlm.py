"""The image parts of the rollout backends (lean.py, hf.py): image prompts of a VLM.

A prompts Batch of a vision-language run carries `vision` (non-tensor: one PromptImages or None
per prompt, models/vlm_inputs.py) beside `prompt_ids`; `chunk_vision` hands each generation
chunk its rows' entries, and the rollout's Batch repeats them for the n samples by reference.

Lean loop: `prefill_inputs` gives the prompt's embeddings with the image features scattered
into its image tokens (the encoder runs once per prompt, before the n samples share the
prefilled cache) and M-RoPE positions (3, B0, P); decoding continues each row from its next
position (max + 1, not the prompt length), the same on all three axes as text tokens are.
Partial rollouts (rollout.partial): after a weight switch `refill_inputs` gives the re-prefill
of prompt + tokens so far the image features (the current tower's) in the prompt's placeholders
only and M-RoPE positions over the whole sequence (vlm_forward.image_inputs, the trainer's own):
a placeholder id the policy sampled stays text, and the sampled tokens keep the positions the
loop gave them (the prompt's next position + t).
HF generate: `generate_kwargs` adds pixel_values / image_grid_thw / mm_token_type_ids, which
transformers' generate encodes once per prompt before expanding to num_return_sequences.

Shapes: B0 prompts, P prompt length, H hidden.
"""
from __future__ import annotations

import torch

from reinforge.models.vlm_forward import (encode_images, image_embeds, image_inputs, ordered_images, vision_spec,
                                          vlm_position_ids)
from reinforge.models.vlm_inputs import collate_images, image_token_type_ids


def chunk_vision(prompts, start: int, stop: int) -> list | None:
    """The `vision` entries of prompts[start:stop], or None for a text batch (or all-text rows)."""
    if "vision" not in prompts:
        return None
    part = prompts["vision"][start:stop]
    return part if any(v is not None for v in part) else None


@torch.no_grad()
def prefill_inputs(model, embed_tokens, ids: torch.Tensor, pmask: torch.Tensor,
                   vision: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B0, P) prompt ids and bool mask, B0 PromptImages -> embeddings (B0, P, H) with the image
    features in place of the image tokens, positions (3, B0, P) and next positions (B0,)."""
    image_token_id, _ = vision_spec(model)
    pos, nxt = vlm_position_ids(model, ids, pmask.long(), vision)
    h = embed_tokens(ids)
    images = ordered_images(vision)
    feats = torch.cat(encode_images(model, images)).to(h.dtype)
    slots = ids == image_token_id
    if int(slots.sum()) != feats.shape[0]:
        raise ValueError(f"{int(slots.sum())} image tokens in the prompts for {feats.shape[0]} image features")
    return h.masked_scatter(slots[..., None], feats), pos, nxt


@torch.no_grad()
def refill_inputs(model, seq: torch.Tensor, keys: torch.Tensor, vision: list) -> tuple[torch.Tensor, torch.Tensor]:
    """(b, L) prompt + generated ids, their bool attended mask, the b rows' PromptImages ->
    embeddings (b, L, H) with the image features in the prompts' placeholders and positions
    (3, b, L) (module docstring)."""
    pos, slots, images = image_inputs(model, seq, keys.long(), vision)
    return image_embeds(model, {"input_ids": seq, "image_slots": slots}, images)["inputs_embeds"], pos


def own_vision(prompts, rows):
    """rows (B0 x n, each prompt's n samples together, as every backend orders them) generated
    in another process from `prompts` (B0): their `vision` set back to the prompts' own
    PromptImages. What came back are unpickled copies (pixels and grids only: no cached
    features, no pictures), not the object the dataset item holds, and the logged samples
    would have no pictures to show. -> rows."""
    if "vision" in prompts and "vision" in rows and len(prompts):
        n = len(rows) // len(prompts)
        rows["vision"] = [prompts["vision"][i // n] for i in range(len(rows))]
    return rows


def generate_kwargs(model, ids: torch.Tensor, vision: list | None) -> dict:
    """The image inputs of transformers' generate for (B0, P) prompts `ids` (empty for text)."""
    if vision is None:
        return {}
    pv, grid = collate_images(vision)
    image_token_id, _ = vision_spec(model)
    return dict(pixel_values=pv.to(ids.device), image_grid_thw=grid.to(ids.device),
                mm_token_type_ids=image_token_type_ids(ids, image_token_id))
