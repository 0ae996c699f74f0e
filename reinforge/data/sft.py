"""SFT dataset and its right-padded collation. Accepted rows (TRL's schemas and reinforge's own):

| columns | target (loss) tokens |
|---|---|
| `prompt`, `response` (text, or messages: the prompt rendered with the generation prompt, the response's last content) | the response + EOS |
| `prompt`, `completion` as text (TRL standard) | the completion + EOS |
| `prompt`, `completion` as messages (TRL conversational) | each assistant turn of the completion |
| `messages` (TRL conversational language modelling) | each assistant turn after the first message |

An assistant turn's target is its content and the template's end-of-turn (reinforge.data.chat_turns).

Image rows (an `images` or `image` column, reinforge.data.images) take `prompt` plus a text
`response` or `completion` (or a completion of one assistant message), and a processor as the
tokenizer; their items also hold "prompt_messages", "images" (the canonical messages and PIL
images) and "vision" (the prompt's PromptImages, models/vlm_inputs.py: what the forward takes),
and their prompt tokens have each image's tokens expanded. Every image check of
reinforge.data.images (unreadable bytes, a missing file, a placeholder count that does not match
the images, data.max_pixels) runs on every row before any is tokenized.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reinforge.data.chat_turns import assistant_turns
from reinforge.data.images import (DEFAULT_MAX_PIXELS, base_dir, encode_image_prompt, has_images, image_prompt,
                                   render_messages, require_processor, text_tokenizer)
from reinforge.models.padding import pad
from reinforge.data.io import DataError, ItemsDataset, file_label, require_columns, row_error
from reinforge.data.text import bos_prefix, check_messages, encode, render_prompt, response_text

if TYPE_CHECKING:  # torch is imported where a batch is built, not at package import
    import torch

    from reinforge.models.vlm_inputs import PromptImages

SFT_OVERLONG = ("error", "skip", "truncate_right")


def _is_messages(value) -> bool:
    return isinstance(value, (list, tuple))


def row_pieces(row: dict, tokenizer, path: str, i: int) -> tuple[list[tuple[str, bool]], str, str]:
    """The row as (text, is_target) pieces in order, and the names of its context and target
    fields (for error messages), by schema (see the module's table)."""
    if row.get("messages") is not None and row.get("prompt") is None:
        messages = check_messages(row["messages"], path, i, "messages")
        return assistant_turns(messages, tokenizer, path, i, "messages"), "messages", "messages"
    if row.get("completion") is not None:
        prompt, completion = row.get("prompt"), row["completion"]
        if _is_messages(completion):
            if not _is_messages(prompt):
                raise row_error(path, i, "prompt", "the completion is a message list, so the prompt must be one too "
                                                   "(TRL's conversational prompt/completion)")
            prompt = check_messages(prompt, path, i, "prompt")
            messages = prompt + check_messages(completion, path, i, "completion")
            return assistant_turns(messages, tokenizer, path, i, "completion", first=len(prompt)), "prompt", "completion"
        target = "completion"
    else:
        target = "response"
    prompt = render_prompt(row.get("prompt"), tokenizer, path, i, "prompt")
    return [(prompt, False), (response_text(row.get(target), path, i, target), True)], "prompt", target


def image_row_pieces(row: dict, image_row: tuple, tokenizer, path: str, i: int) -> tuple[list, str, str]:
    """row_pieces of an image row: its canonical prompt rendered, then the response (the text,
    or the one assistant message, of `response` or `completion`) as the target; or, for a
    `messages` row, each assistant turn after the first message (their contents as text: an
    assistant turn shows no image)."""
    messages = image_row[0]
    if row.get("messages") is not None and row.get("prompt") is None:
        require_processor(tokenizer, path, i, "messages")
        turns = [{**m, "content": _assistant_text(m["content"], path, i, k)} if m["role"] == "assistant" else m
                 for k, m in enumerate(messages)]
        return assistant_turns(turns, tokenizer, path, i, "messages"), "messages", "messages"
    require_processor(tokenizer, path, i, "prompt")
    target = "completion" if row.get("completion") is not None else "response"
    value = row.get(target)
    if isinstance(value, (list, tuple)) and len(value) != 1:
        raise row_error(path, i, target, "an image row's completion is a text or one assistant message")
    prompt = render_messages(tokenizer, messages, path, i, "prompt")
    return [(prompt, False), (response_text(value, path, i, target), True)], "prompt", target


def _assistant_text(content, path: str, i: int, k: int) -> str:
    """An assistant message's canonical content as text (its text parts joined)."""
    if isinstance(content, str):
        return content
    if any(p["type"] == "image" for p in content):
        raise row_error(path, i, "messages", f"message {k} (assistant) shows an image: images go in user messages")
    return "".join(p["text"] for p in content)


def encode_image_pieces(processor, pieces: list[tuple[str, bool]], images: list, path: str, i: int,
                        field: str) -> tuple[list[list[int]], "PromptImages"]:
    """Token ids of each (text, is_target) piece of an image row, the images of a context piece
    (one per image marker it holds, in order) expanded into their tokens, and the row's one
    PromptImages (every piece's pixels and grids, in token order)."""
    import torch

    from reinforge.models.vlm_inputs import PromptImages

    marker, out, parts, used = processor.image_token, [], [], 0
    for text, target in pieces:
        k = 0 if target else text.count(marker)
        if k == 0:
            out.append(list(processor.tokenizer(text, add_special_tokens=False)["input_ids"]))
            continue
        ids, part = encode_image_prompt(processor, text, images[used:used + k])
        out.append(ids)
        parts.append(part)
        used += k
    if used != len(images):
        raise row_error(path, i, field, f"the rendered conversation shows {used} image(s) for the row's {len(images)}")
    return out, PromptImages(torch.cat([p.pixel_values for p in parts]), torch.cat([p.image_grid_thw for p in parts]))


def fit_length(ids: list[int], mask: list[int], max_length: int, policy: str, path: str, i: int,
               field: str):
    """Apply the overlong policy; returns (ids, mask) or None to skip the row."""
    if len(ids) <= max_length:
        return ids, mask
    if policy == "error":
        raise row_error(path, i, field, f"the row encodes to {len(ids)} tokens > data.max_length={max_length} "
                        "(set data.overlong=skip or truncate_right)")
    if policy == "skip" or sum(mask[:max_length]) == 0:
        return None  # truncation would leave no target token to learn from
    return ids[:max_length], mask[:max_length]


class SFTDataset(ItemsDataset):
    """Items {"input_ids": list[int] (L_i,), "loss_mask": list[int] (L_i,)}.

    input_ids are the row's pieces (row_pieces) encoded one by one and joined, plus an EOS when
    the last target does not already end with one, after the tokenizer's BOS when it adds one and
    the row's text does not start with it (data/text.bos_prefix: Gemma's, Llama 3's on plain-text
    rows); loss_mask is 1 on target tokens (and that EOS: the model must learn to stop), 0 on context. loss_mask[t] marks token t as a target, so
    with next-token logits the trainer uses loss_mask[:, 1:] against input_ids[:, 1:].
    """

    def __init__(self, path: str, tokenizer, *, max_length: int, overlong: str = "error",
                 max_pixels: int = DEFAULT_MAX_PIXELS):
        if overlong not in SFT_OVERLONG:
            raise ValueError(f"overlong must be one of {SFT_OVERLONG}, got {overlong!r}")
        tok = text_tokenizer(tokenizer)
        rows = self._read(path, tok, need_eos=True)
        if not any("messages" in row for row in rows):
            target = "completion" if any("completion" in row for row in rows) else "response"
            require_columns(rows, self.path, ("prompt", target),
                            "an SFT file has prompt and response (or completion) columns, or messages")
        root = base_dir(self.path) if has_images(rows) else None
        visual = {}
        for i, row in enumerate(rows):
            key = "messages" if row.get("messages") is not None and row.get("prompt") is None else "prompt"
            if root is not None and (image_row := image_prompt(row, self.path, i, key, root=root,
                                                               max_pixels=max_pixels)) is not None:
                visual[i] = image_row
        rows_pieces = [image_row_pieces(row, visual[i], tokenizer, self.path, i) if i in visual
                       else row_pieces(row, tok, self.path, i) for i, row in enumerate(rows)]
        # One tokenizer call for every piece of every row (fast tokenizers batch in Rust).
        flat = encode(tok, [text for pieces, _, _ in rows_pieces for text, _ in pieces])
        starts = [0]
        for pieces, _, _ in rows_pieces:
            starts.append(starts[-1] + len(pieces))
        vision = {}  # row -> PromptImages: the pixels the forward sees
        for i, (_, images) in visual.items():  # the context pieces, their image tokens expanded
            pieces, context_field, _ = rows_pieces[i]
            flat[starts[i]:starts[i + 1]], vision[i] = encode_image_pieces(tokenizer, pieces, images, self.path, i,
                                                                           context_field)
        eos, bos = tok.eos_token_id, bos_prefix(tok)
        self.items, self.num_skipped, at = [], 0, 0
        for i, (pieces, context_field, target_field) in enumerate(rows_pieces):
            ids, mask = [], []
            for (_, target), piece_ids in zip(pieces, flat[at:at + len(pieces)]):
                ids += piece_ids
                mask += [int(target)] * len(piece_ids)
            at += len(pieces)
            for field, flag in ((context_field, 0), (target_field, 1)):
                if flag not in mask:
                    raise row_error(self.path, i, field, "encodes to 0 tokens with this tokenizer "
                                                         "(does its vocabulary cover the text?)")
            if ids[-1] != eos:
                ids, mask = ids + [eos], mask + [1]
            if bos and ids[:len(bos)] != bos:  # a plain-text row starts with the BOS a template would write
                ids, mask = bos + ids, [0] * len(bos) + mask
            if i in visual:
                check_target_placeholders(ids, mask, tokenizer.image_token_id, self.path, i, target_field)
            fitted = fit_length(ids, mask, max_length, overlong, self.path, i, target_field)
            if fitted is None:
                self.num_skipped += 1
                continue
            self.items.append({"input_ids": fitted[0], "loss_mask": fitted[1]})
            if i in visual:
                self.items[-1]["prompt_messages"], self.items[-1]["images"] = visual[i]
                self.items[-1]["vision"] = vision[i]
        if not self.items:
            raise DataError(f"{file_label(self.path)}: no row fits data.max_length={max_length}")


def check_target_placeholders(ids: list[int], mask: list[int], image_id: int, path: str, i: int, field: str) -> None:
    """A target that spells the image placeholder is text to learn, and the forward tells the
    images' placeholders by count (the first n of the row: models/vlm_forward.prompt_image_slots),
    so no target placeholder may come before an image's; DataError otherwise."""
    last_image = max((t for t, (x, m) in enumerate(zip(ids, mask)) if x == image_id and not m), default=-1)
    if any(x == image_id and m for x, m in zip(ids[:last_image], mask[:last_image])):
        raise row_error(path, i, field, "a target spells the image placeholder token before a later image "
                                        "(move the images before it, or drop the token from the target)")


def collate_sft(items: list[dict], pad_id: int) -> dict:
    """Right-padded batch: input_ids, attention_mask, loss_mask, each (B, L) int64; and when
    some item has images, "vision": the B PromptImages (None for a text row), each item's own
    object (a frozen tower's features cached on it are reused by later steps)."""
    input_ids, attention_mask = pad([it["input_ids"] for it in items], pad_id)
    loss_mask, _ = pad([it["loss_mask"] for it in items], 0)
    out = {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}
    if any(it.get("vision") is not None for it in items):
        out["vision"] = [it.get("vision") for it in items]
    return out
