"""Image prompts -> model inputs: a prompt's token ids (image placeholders expanded) and its
images' patches, kept per prompt, then left-padded batches with reinforge's conventions.

A prompt is a chat message list whose content parts include `{"type": "image"}` and a list of
PIL RGB images, one per image part, in order (data/'s canonical row, see docs/models_and_data.md).
`encode_prompt` renders it with the processor's chat template (`add_generation_prompt=True`, as
text prompts are) and runs the processor on it: the ids have one `<|image_pad|>` per merged
patch group, and a `PromptImages` holds the patches.

A `PromptImages` travels with its prompt through the pipeline as a per-row Python value (a
Batch non-tensor: rows have different numbers of patches, so they cannot share a tensor's batch
dimension). Repeating a prompt for its n samples repeats the reference, not the patches; the
vision encoder runs once per distinct object (models/vlm_forward.py), so a group's n samples
share one encoding. Equality is identity (eq=False), which is what that de-duplication and
Batch.union's "shared keys hold equal values" need.

Shapes: B prompts, P = data.max_prompt_length, N patches (rows of 3 * 2 * 14 * 14 values for
Qwen2-VL), K images.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from reinforge.models.padding import pad


@dataclass(frozen=True, eq=False)
class PromptImages:
    """One prompt's images as the processor gives them: pixel_values (N, D) and image_grid_thw
    (K, 3), the (t, h, w) patch grid of each image in order. `features`: a frozen vision
    tower's output for them, kept by models/vlm_forward.encode_images (keyed by the tower).
    `images`: the decoded pictures themselves (PIL, the dataset item's own objects), for the
    logged training samples' thumbnails (trainers/metrics.sample_rows); () when not kept."""
    pixel_values: torch.Tensor
    image_grid_thw: torch.Tensor
    features: dict = field(default_factory=dict, repr=False, compare=False)
    images: tuple = field(default=(), repr=False, compare=False)

    def __len__(self) -> int:
        return self.image_grid_thw.shape[0]

    def __reduce__(self):
        """Pickled (a checkpoint's rows in flight, trainers/async_rollout.CHUNKS_FILE) without
        `features`: their keys name towers of this process (vlm_forward._tower_key), numbers
        that another process gives to other towers."""
        return (PromptImages, (self.pixel_values, self.image_grid_thw))


def render(processor, messages: list[dict]) -> str:
    """The prompt text: the chat template with image parts as vision blocks, ending where the
    assistant's reply begins."""
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def encode_prompt(processor, messages: list[dict], images: list | None) -> tuple[list[int], PromptImages | None]:
    """-> (prompt token ids with image placeholders expanded, PromptImages or None when the
    prompt has no image)."""
    text = render(processor, messages)
    if not images:
        return processor.tokenizer(text, add_special_tokens=False)["input_ids"], None
    out = processor(text=[text], images=[list(images)], return_tensors="pt")
    return out["input_ids"][0].tolist(), PromptImages(out["pixel_values"], out["image_grid_thw"])


def collate_images(vision: list[PromptImages | None]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Per-row images -> (pixel_values (N, D), image_grid_thw (K, 3)) concatenated in row order
    (the order of the image tokens in a (B, L) batch), or (None, None) when no row has one."""
    present = [v for v in vision if v is not None]
    if not present:
        return None, None
    return torch.cat([v.pixel_values for v in present]), torch.cat([v.image_grid_thw for v in present])


def image_token_type_ids(input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """(B, L) -> (B, L) int64: 1 on image tokens, 0 elsewhere (transformers' mm_token_type_ids)."""
    return (input_ids == image_token_id).long()


def prompt_batch(processor, prompts: list[tuple[list[dict], list | None]], max_prompt_length: int) -> dict:
    """(messages, images) pairs -> the model inputs of B prompts, left-padded to
    max_prompt_length (ValueError naming data.max_prompt_length if one is longer):
    input_ids, attention_mask, mm_token_type_ids (B, P); pixel_values (N, D), image_grid_thw
    (K, 3) (absent when no prompt has an image); `vision`: the B PromptImages (or None), the
    per-row form the pipeline carries. `model(**{k: v for k, v in out.items() if k != "vision"})`
    and `model.generate(...)` take the rest as is."""
    encoded = [encode_prompt(processor, m, imgs) for m, imgs in prompts]
    for i, (ids, _) in enumerate(encoded):
        if len(ids) > max_prompt_length:
            raise ValueError(f"prompt {i} has {len(ids)} tokens (images expanded) > "
                             f"data.max_prompt_length={max_prompt_length}")
    tok = processor.tokenizer
    ids, mask = pad([e[0] for e in encoded], tok.pad_token_id, side="left", length=max_prompt_length)
    vision = [e[1] for e in encoded]
    out = dict(input_ids=ids, attention_mask=mask, mm_token_type_ids=image_token_type_ids(ids, processor.image_token_id))
    pv, grid = collate_images(vision)
    if pv is not None:
        out.update(pixel_values=pv, image_grid_thw=grid)
    out["vision"] = vision
    return out
