"""The image parts of the forward passes: M-RoPE positions of a batch and the vision encoder's
features, computed once per distinct prompt.

`forward.token_logprobs` and its callers take `vision`, the B rows' `PromptImages` (or None),
and go through here only when it is given, so the text path does no extra work.

- `vlm_position_ids`: (3, B, L) positions of a left-padded / right-padded batch (models/mrope.py).
- `image_outputs`: the features of every image in the order their tokens appear, as the
  `mm_encoder_outputs` transformers' Qwen2-VL forward accepts instead of pixel_values. The
  encoder runs once on the distinct PromptImages (identity) of the call: a group's n samples
  are one encoding. With the vision tower frozen (no parameter requiring grad) it runs under
  no_grad, so no activations are kept for it, and its features are kept on the PromptImages
  (keyed by the tower, its dtype and device), so the step's later passes over the same prompts
  (old log-probs, the reference, every micro-batch and epoch of the update) reuse the
  rollout's encoding: once per prompt per step and tower. A tower that trains encodes anew.

Shapes: B rows, L tokens, K images, F image tokens (features), H hidden.
"""
from __future__ import annotations

import weakref

import torch

from reinforge.models.mrope import mrope_position_ids


def _inner(model):
    from reinforge.models.forward import unwrap_peft

    return unwrap_peft(model)


def vision_spec(model) -> tuple[int, int]:
    """(image_token_id, spatial_merge_size) of a Qwen2-VL-style model."""
    cfg = _inner(model).config
    return cfg.image_token_id, cfg.vision_config.spatial_merge_size


def is_vlm(model) -> bool:
    return hasattr(_inner(model).config, "vision_config")


def ordered_images(vision: list) -> list:
    """The rows' PromptImages in row order, rows without images skipped (the order of the image
    tokens in a (B, L) batch)."""
    return [v for v in vision if v is not None]


def grids_of(images: list) -> torch.Tensor | None:
    """(K, 3) patch grids of `images` in order, or None."""
    return torch.cat([v.image_grid_thw for v in images]) if images else None


def vlm_position_ids(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     vision: list) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) ids and 0/1 mask of rows with images `vision` (B,) -> M-RoPE positions (3, B, L)
    and each row's next position (B,) (mrope.mrope_position_ids)."""
    image_token_id, merge = vision_spec(model)
    return mrope_position_ids(attention_mask, input_ids == image_token_id, grids_of(ordered_images(vision)), merge)


class EncoderCounter:
    """Counts the vision encoder's forward calls and the images they encode (tests)."""

    def __init__(self, model):
        self.calls, self.images = 0, 0
        self._h = _inner(model).model.visual.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        self.calls += 1
        grid = args[1] if len(args) > 1 else kwargs.get("grid_thw")
        self.images += int(grid.shape[0]) if grid is not None else 0

    def close(self):
        self._h.remove()


def encode_images(model, images: list) -> list[torch.Tensor]:
    """The merged features (F_i, H) of each distinct PromptImages in `images` (identity), in one
    encoder call; -> one tensor per entry of `images` (repeats share their distinct entry's)."""
    inner = _inner(model)
    first: dict[int, int] = {}
    distinct = []
    for v in images:
        if id(v) not in first:
            first[id(v)] = len(distinct)
            distinct.append(v)
    visual = inner.model.visual
    frozen = not any(p.requires_grad for p in visual.parameters())
    param = next(visual.parameters())
    key = (_tower_uid(visual), param.dtype, param.device)
    todo = [v for v in distinct if not (frozen and key in v.features)]
    if todo:
        with torch.set_grad_enabled(torch.is_grad_enabled() and not frozen):
            pv = torch.cat([v.pixel_values for v in todo]).to(param.device)
            grid = torch.cat([v.image_grid_thw for v in todo]).to(pv.device)
            feats = inner.model.get_image_features(pv, grid).pooler_output  # one (F_k, H) per image
        fresh, k = {}, 0
        for v in todo:
            fresh[id(v)] = torch.cat(feats[k:k + len(v)])
            k += len(v)
            if frozen:
                v.features[key] = fresh[id(v)]
    out = {id(v): v.features[key] if frozen else fresh[id(v)] for v in distinct}
    return [out[id(v)] for v in images]


_UIDS = iter(range(1 << 62))
_TOWERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _tower_uid(visual) -> int:
    """A number naming this vision tower object for as long as it lives: id() may be reused by
    a later module at the same address, and an attribute would be copied by a deepcopy (the
    asynchronous producer's model), either of which could read another tower's features."""
    if visual not in _TOWERS:
        _TOWERS[visual] = next(_UIDS)
    return _TOWERS[visual]


def image_outputs(model, images: list) -> dict:
    """`mm_encoder_outputs` for transformers' Qwen2-VL forward: the features of `images` (the
    PromptImages in token order) as one pooled output."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    feats = encode_images(model, images)
    return {"image": BaseModelOutputWithPooling(pooler_output=(torch.cat(feats),))}


def vision_token(model) -> int:
    """The image placeholder id of a Qwen2-VL-style model."""
    return vision_spec(model)[0]


def prompt_image_slots(model, input_ids: torch.Tensor, response_len: int) -> torch.Tensor:
    """(B, L) bool: the image placeholders of the prompt part (all but the last `response_len`
    columns). A response may sample the placeholder id (a random or weak policy does); the rollout
    embeds it as the token it is, so it takes no image feature and no image positions."""
    slots = input_ids == vision_token(model)
    slots[:, input_ids.shape[1] - response_len:] = False
    return slots


def image_embeds(model, fwd: dict, images: list) -> dict:
    """fwd with `input_ids` and `image_slots` (B, L) replaced by `inputs_embeds` (B, L, H): the
    token embeddings with the features of `images` (PromptImages in token order) scattered into
    the slots. The features must fill the slots exactly."""
    fwd = dict(fwd)
    ids, slots = fwd.pop("input_ids"), fwd.pop("image_slots")
    feats = torch.cat(encode_images(model, images))  # (F, H)
    if feats.shape[0] != int(slots.sum()):
        raise ValueError(f"{int(slots.sum())} image placeholder tokens in the prompts for {feats.shape[0]} image features")
    emb = model.get_input_embeddings()(ids)
    fwd["inputs_embeds"] = emb.masked_scatter(slots[..., None].expand_as(emb), feats.to(emb.dtype))
    return fwd
