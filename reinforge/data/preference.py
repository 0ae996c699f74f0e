"""Preference pairs (prompt/chosen/rejected) for DPO and reward-model training, and unpaired
labelled completions (prompt/completion/label) for KTO."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reinforge.data.images import (DEFAULT_MAX_PIXELS, base_dir, encode_image_prompt, has_images, image_prompt,
                                   render_messages, require_processor, text_tokenizer)
from reinforge.data.io import DataError, ItemsDataset, file_label, require_columns, row_error
from reinforge.data.sft import collate_sft
from reinforge.data.text import encode, nonempty_ids, render_prompt, response_text, with_bos

if TYPE_CHECKING:  # torch is imported where a batch is built, not at package import
    import torch

PREF_OVERLONG = ("error", "skip")


def prompts_with_images(rows: list[dict], tokenizer, path: str, max_pixels: int) -> tuple[list[str], dict, list]:
    """Each row's prompt text, the canonical (messages, images, PromptImages) of its image rows
    by row, and each prompt's token ids (image tokens expanded): the prompt side of both
    preference datasets (reinforge.data.images; image rows need a processor as `tokenizer`)."""
    root = base_dir(path) if has_images(rows) else None
    tok, prompts, visual = text_tokenizer(tokenizer), [], {}
    for i, row in enumerate(rows):
        image_row = image_prompt(row, path, i, "prompt", root=root, max_pixels=max_pixels) if root else None
        if image_row is None:
            prompts.append(render_prompt(row.get("prompt"), tok, path, i, "prompt"))
        else:
            visual[i] = image_row
            prompts.append(None)  # rendered below, once every row's images passed their checks
    for i, (messages, _) in visual.items():
        require_processor(tokenizer, path, i, "prompt")
        prompts[i] = render_messages(tokenizer, messages, path, i, "prompt")
    ids = encode(tok, prompts)
    for i, (messages, images) in visual.items():
        ids[i], vision = encode_image_prompt(tokenizer, prompts[i], images)
        visual[i] = (messages, images, vision)
    return prompts, visual, with_bos(tok, nonempty_ids(ids, path, "prompt"))


def _add_images(item: dict, image_row: tuple) -> dict:
    """An item of an image row with its "prompt_messages", "images" and "vision" (PromptImages)."""
    item["prompt_messages"], item["images"], item["vision"] = image_row
    return item


class PreferenceDataset(ItemsDataset):
    """Items {"prompt_text": str, "prompt_ids", "chosen_ids", "rejected_ids": list[int]}.

    chosen/rejected may be text or message lists (TRL's conversational form: the last
    message's content is the response). Both responses end with eos. Rows with a missing
    field, an empty response or chosen == rejected raise DataError naming file, row and field:
    an identical pair carries no preference and would silently give a zero DPO gradient.
    Image rows (reinforge.data.images: TRL's vision DPO rows, `images` beside prompt/chosen/
    rejected, or veRL's `<image>` prompts) also hold "prompt_messages", "images" and "vision",
    the prompt's PromptImages, which its chosen and rejected sequences share.
    """

    def __init__(self, path: str, tokenizer, *, max_length: int, overlong: str = "error",
                 max_pixels: int = DEFAULT_MAX_PIXELS):
        if overlong not in PREF_OVERLONG:
            raise ValueError(f"overlong must be one of {PREF_OVERLONG}, got {overlong!r}")
        rows = self._read(path, text_tokenizer(tokenizer), need_eos=True)
        require_columns(rows, self.path, ("prompt", "chosen", "rejected"),
                        "a preference file has prompt, chosen and rejected columns")
        prompts, visual, p_ids = prompts_with_images(rows, tokenizer, self.path, max_pixels)
        tokenizer = text_tokenizer(tokenizer)
        chosen, rejected = [], []
        for i, row in enumerate(rows):
            chosen.append(response_text(row.get("chosen"), self.path, i, "chosen"))
            rejected.append(response_text(row.get("rejected"), self.path, i, "rejected"))
            if chosen[-1].strip() == rejected[-1].strip():
                raise row_error(self.path, i, "rejected", "identical to 'chosen'")
        eos = tokenizer.eos_token_id
        c_ids, r_ids = (nonempty_ids(encode(tokenizer, texts), self.path, field)
                        for texts, field in ((chosen, "chosen"), (rejected, "rejected")))
        self.items, self.num_skipped = [], 0
        for i, (text, p, c, r) in enumerate(zip(prompts, p_ids, c_ids, r_ids)):
            longest = len(p) + max(len(c), len(r)) + 1
            if longest > max_length:
                if overlong == "error":
                    raise row_error(self.path, i, "chosen" if len(c) >= len(r) else "rejected",
                                    f"prompt + response is {longest} tokens > data.max_length={max_length} (set data.overlong=skip)")
                self.num_skipped += 1
                continue
            self.items.append({"prompt_text": text, "prompt_ids": p, "chosen_ids": c + [eos], "rejected_ids": r + [eos]})
            if i in visual:
                _add_images(self.items[-1], visual[i])
        if not self.items:
            raise DataError(f"{file_label(self.path)}: no pair fits data.max_length={max_length}")


def collate_preference(items: list[dict], pad_id: int) -> dict[str, "torch.Tensor"]:
    """Chosen rows then rejected rows, right-padded: input_ids, attention_mask, loss_mask (2B, L).

    Row b and row B + b are the chosen and rejected sequence of pair b; loss_mask is 1 on
    response tokens (incl. eos), so sequence log-probs are sums over loss_mask[:, 1:]. With image
    prompts, "vision" (2B,): rows b and B + b hold pair b's one PromptImages (encoded once).
    """
    return collate_sft(_prompt_and(items, "chosen_ids") + _prompt_and(items, "rejected_ids"), pad_id)


def _prompt_and(items: list[dict], key: str) -> list[dict]:
    """SFT-style rows: each item's prompt ids followed by its `key` ids, loss on the latter only."""
    return [{"input_ids": it["prompt_ids"] + it[key], "loss_mask": [0] * len(it["prompt_ids"]) + [1] * len(it[key]),
             "vision": it.get("vision")} for it in items]


def _label(value, path: str, row: int) -> bool:
    """A row's label as a bool: True/False, 0/1 or numpy's bool_; anything else is a DataError."""
    if value is None:
        raise row_error(path, row, "label", "missing")
    if not isinstance(value, str) and value in (True, False):
        return bool(value)
    raise row_error(path, row, "label", f"{value!r} is not a boolean (true: desirable, false: undesirable)")


class UnpairedPreferenceDataset(ItemsDataset):
    """Items {"prompt_text": str, "prompt_ids", "completion_ids": list[int], "label": bool}.

    Rows are TRL's unpaired preference schema (prompt, completion, label: true = desirable), or
    prompt/chosen/rejected pairs, each split into a desirable and an undesirable item (as TRL
    unpairs them for KTO). Completions may be text or message lists and end with eos; a missing
    or empty field, or a non-boolean label, raises DataError naming file, row and field.
    Image rows (reinforge.data.images) also hold "prompt_messages", "images" and "vision".
    """

    def __init__(self, path: str, tokenizer, *, max_length: int, overlong: str = "error",
                 max_pixels: int = DEFAULT_MAX_PIXELS):
        if overlong not in PREF_OVERLONG:
            raise ValueError(f"overlong must be one of {PREF_OVERLONG}, got {overlong!r}")
        rows = self._read(path, text_tokenizer(tokenizer), need_eos=True)
        paired = not any("completion" in row for row in rows)
        fields = ("chosen", "rejected") if paired else ("completion",)
        require_columns(rows, self.path, ("prompt", *fields) if paired else ("prompt", "completion", "label"),
                        "an unpaired preference file has prompt, completion and label columns "
                        "(or prompt, chosen and rejected)")
        prompts, visual, p_ids = prompts_with_images(rows, tokenizer, self.path, max_pixels)
        tokenizer = text_tokenizer(tokenizer)
        # Per field: (token ids of each row's completion, each row's label).
        columns = []
        for field in fields:
            texts = [response_text(row.get(field), self.path, i, field) for i, row in enumerate(rows)]
            labels = ([field == "chosen"] * len(rows) if paired
                      else [_label(row.get("label"), self.path, i) for i, row in enumerate(rows)])
            columns.append((field, nonempty_ids(encode(tokenizer, texts), self.path, field), labels))
        eos = tokenizer.eos_token_id
        self.items, self.num_skipped = [], 0
        for i, (text, p) in enumerate(zip(prompts, p_ids)):
            for field, ids, labels in columns:
                c = ids[i]
                if len(p) + len(c) + 1 > max_length:
                    if overlong == "error":
                        raise row_error(self.path, i, field, f"prompt + response is {len(p) + len(c) + 1} tokens > "
                                        f"data.max_length={max_length} (set data.overlong=skip)")
                    self.num_skipped += 1
                    continue
                self.items.append({"prompt_text": text, "prompt_ids": p, "completion_ids": c + [eos],
                                   "label": labels[i]})
                if i in visual:
                    _add_images(self.items[-1], visual[i])
        if not self.items:
            raise DataError(f"{file_label(self.path)}: no completion fits data.max_length={max_length}")


def collate_unpaired(items: list[dict], pad_id: int) -> dict[str, "torch.Tensor"]:
    """One right-padded row per item: input_ids, attention_mask, loss_mask (B, L); loss_mask is 1
    on the completion's tokens (incl. eos)."""
    return collate_sft(_prompt_and(items, "completion_ids"), pad_id)
