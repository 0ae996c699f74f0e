"""The image parts of the forward passes: M-RoPE positions of a batch and the vision encoder's
features, computed once per distinct prompt.

`forward.token_logprobs` and its callers take `vision`, the B rows' `PromptImages` (or None),
and go through here only when it is given, so the text path does no extra work.

- `vlm_position_ids`: (3, B, L) positions of a left-padded / right-padded batch (models/mrope.py);
  the rollout's prompts use it as is.
- `image_inputs`: what every log-prob forward (padded RL rows, SFT and DPO rows, and packed rows
  through models/packing.py) adds for images: `prompt_image_slots`, the one mask of the
  placeholders that take image features (the prompts', never a response's), the M-RoPE positions
  with only those as image tokens, and the images in token order.
- `image_embeds`: the token embeddings with the features scattered into those slots (the
  trainer builds `inputs_embeds` itself, as the rollouts do). The encoder runs once on the
  distinct PromptImages (identity) of the call: a group's n samples (and DPO's chosen and
  rejected rows) are one encoding. With the vision tower frozen (no parameter requiring grad) it runs under
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
    uid, generation = _tower_key(visual)
    key = (uid, generation, param.dtype, param.device)
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
                for old in [k for k in v.features if k[0] == uid and k[1] != generation]:
                    del v.features[old]  # this tower's features under weights it no longer has
                v.features[key] = fresh[id(v)]
    out = {id(v): v.features[key] if frozen else fresh[id(v)] for v in distinct}
    return [out[id(v)] for v in images]


_UIDS = iter(range(1 << 62))
_TOWERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _tower_key(visual) -> tuple[int, int]:
    """(uid, generation) of this vision tower object: the uid names it for as long as it lives
    (id() may be reused by a later module at the same address, and an attribute would be
    copied by a deepcopy, the asynchronous producer's model, either of which could read another
    tower's features); the generation counts the times its weights were overwritten in place
    (`tower_weights_loaded`), so a frozen copy that loads new tower weights encodes anew."""
    if visual not in _TOWERS:
        _TOWERS[visual] = (next(_UIDS), 0)
    return _TOWERS[visual]


def tower_weights_loaded(model, names) -> None:
    """Parameters `names` of `model` were just overwritten in place (the asynchronous behaviour
    copy's load: its tower has no parameter requiring grad, so its features are cached): when
    one of them is the vision tower's (model.freeze_vision_tower=false trains it), the features
    cached for the tower's old weights are no longer read. A model without a tower: nothing to do."""
    visual = getattr(getattr(_inner(model), "model", None), "visual", None)
    if visual is None:
        return
    tower = {id(p) for p in visual.parameters()}
    params = dict(model.named_parameters())
    if any(id(params[n]) in tower for n in names if n in params):
        uid, generation = _tower_key(visual)
        _TOWERS[visual] = (uid, generation + 1)


def vision_token(model) -> int:
    """The image placeholder id of a Qwen2-VL-style model."""
    return vision_spec(model)[0]


def image_token_counts(model, vision: list) -> list[int]:
    """(B,) the image tokens each row's PromptImages fill (sum over its images of t*h*w / m^2,
    the merged grid), 0 for a row without images."""
    merge = vision_spec(model)[1]
    return [int(v.image_grid_thw.prod(-1).sum()) // merge ** 2 if v is not None else 0 for v in vision]


def prompt_image_slots(model, input_ids: torch.Tensor, vision: list) -> torch.Tensor:
    """(B, L) ids, the B rows' PromptImages (or None) -> (B, L) bool: the image placeholders of
    the rows' prompts, i.e. the first n_b placeholders of row b (n_b = image_token_counts). In
    every layout a prompt comes before its response (left-padded RL rows, right-padded SFT and
    DPO rows), so a later placeholder belongs to a response: a random or weak policy samples the
    id, a completion may spell it. The rollout embeds it as the token it is, so it takes no image
    feature and no image positions, in the padded and the packed forward alike (the one mask
    both use). ValueError when a row has fewer placeholders than its images fill."""
    is_ph = input_ids == vision_token(model)
    rank = is_ph.long().cumsum(-1)  # (B, L): placeholders up to and including each column
    n = torch.tensor(image_token_counts(model, vision), device=input_ids.device)  # (B,)
    short = (rank[:, -1] < n).nonzero()
    if len(short):
        b = int(short[0])
        raise ValueError(f"row {b}: {int(rank[b, -1])} image placeholder tokens for its images' {int(n[b])} tokens")
    return is_ph & (rank <= n[:, None])


def image_inputs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 vision: list) -> tuple[torch.Tensor, torch.Tensor, list]:
    """What a log-prob forward of a padded (B, L) VLM batch adds: M-RoPE positions (3, B, L)
    with the prompts' placeholders (prompt_image_slots) as the only image tokens, those slots
    (B, L) and the rows' PromptImages in token order (for image_embeds)."""
    slots = prompt_image_slots(model, input_ids, vision)
    images = ordered_images(vision)
    pos, _ = mrope_position_ids(attention_mask, slots, grids_of(images), vision_spec(model)[1])
    return pos, slots, images


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
