"""Image prompts: veRL's and TRL's multimodal rows -> one canonical in-memory form, checked up front.

The canonical form of an image row (what every dataset item with images carries, and what
reinforge.models.vlm_inputs.encode_prompt takes):

    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]
    images   = [<PIL.Image.Image mode=RGB>]         # one per {"type": "image"} part, in that order

i.e. chat messages in the form Hugging Face processors' chat templates take: a content that
shows an image is a list of parts, {"type": "image"} where an image goes and {"type": "text",
"text": ...} for text; a message without images may keep a plain string content. The images are
decoded with Pillow and converted to RGB.

Accepted rows (from parquet, JSONL, save_to_disk folders and hf://datasets/..., data.io):

| schema | prompt | images |
|---|---|---|
| veRL (its geo3k preprocessing) | messages whose string contents hold `<image>` placeholders | `images`: a list |
| TRL | messages that may carry {"type": "image"} parts, or text | `images` (a list) or `image` (one) |

An image value is a {"bytes": ..., "path": ...} dict (what `datasets`' Image feature stores and
veRL's parquet files hold), raw bytes, a path string, or a PIL image. A relative path resolves
against the folder of the data file (the folder itself for a save_to_disk folder). A plain-text
prompt with images becomes one user message. A prompt with no image placeholder at all gets its
images in front of the first user message's text (as TRL does for an `image` column beside a
placeholder-free prompt); any other count of placeholders that differs from the number of images
is an error.

Checked for every row before a model loads (DataError naming file, row and field): an image
that cannot be read (bad bytes, a missing path, neither bytes nor path), a placeholder count
that does not match the images, an image with more than `max_pixels` pixels (data.max_pixels).
"""

from __future__ import annotations

import io
import os
from typing import Any

from reinforge.data.io import DataError, row_error

IMAGE_PLACEHOLDER = "<image>"  # veRL's marker in a message's text
IMAGE_COLUMNS = ("images", "image")  # tried in this order
# The Qwen2-VL image processor's own default budget (16384 patches of 28x28): far past anything a
# processor keeps without resizing, small enough to refuse a decompression bomb or a scanned poster.
DEFAULT_MAX_PIXELS = 16384 * 28 * 28


def image_column(row: dict) -> str | None:
    """The row's image column ("images", else "image"), or None when it has neither (or it is null)."""
    return next((c for c in IMAGE_COLUMNS if row.get(c) is not None), None)


def has_images(rows: list[dict]) -> bool:
    """Whether any row of a file has an image column: the file is then read as image rows."""
    return any(image_column(row) is not None for row in rows)


def base_dir(path: str) -> str | None:
    """The folder relative image paths of the data file `path` resolve against (None for a Hub
    dataset: its images are bytes)."""
    from reinforge.data.hf_datasets import HF_PREFIX, saved_folder

    if path.startswith(HF_PREFIX):
        return None
    folder = saved_folder(path)
    return os.path.abspath(folder[0] if folder else os.path.dirname(os.path.abspath(path)))


def _too_big(image, max_pixels: int, where) -> None:
    w, h = image.size
    if w * h > max_pixels:
        raise where(f"image is {w}x{h} = {w * h} pixels > data.max_pixels={max_pixels} "
                    "(shrink the images, or raise data.max_pixels)")


def _open(value: Any, root: str | None, where, max_pixels: int) -> "Any":
    """A PIL image from one image value (see the module's doc), fully decoded, in RGB; its size
    is checked against `max_pixels` from the header, before its pixels are decoded."""
    from PIL import Image

    if isinstance(value, Image.Image):
        image = value
        _too_big(image, max_pixels, where)
    else:
        data, file = value, None
        if isinstance(value, dict):
            data, file = value.get("bytes"), value.get("path")
            if data is None and not file:
                raise where("neither 'bytes' nor 'path' is set")
        elif isinstance(value, str):
            data, file = None, value
        elif not isinstance(value, (bytes, bytearray, memoryview)):
            raise where(f"expected image bytes, a path or a {{'bytes', 'path'}} dict, got {type(value).__name__}")
        if data is None:
            if not os.path.isabs(file):
                if root is None:
                    raise where(f"relative path {file!r} in a Hub dataset (store image bytes, or an absolute path)")
                file = os.path.join(root, file)
            if not os.path.isfile(file):
                raise where(f"image file {file} not found")
            with open(file, "rb") as f:
                data = f.read()
        try:
            image = Image.open(io.BytesIO(bytes(data)))
        except Exception as exc:  # Pillow raises UnidentifiedImageError, OSError, SyntaxError, ...
            raise where(f"unreadable image ({type(exc).__name__}: {exc})") from None
        _too_big(image, max_pixels, where)
        try:
            image.load()  # decode now: a truncated file fails here, not in the middle of a rollout
        except Exception as exc:
            raise where(f"unreadable image ({type(exc).__name__}: {exc})") from None
    return image if image.mode == "RGB" else image.convert("RGB")


def decode_images(row: dict, path: str, i: int, *, root: str | None, max_pixels: int) -> tuple[str | None, list]:
    """(the image column, its images decoded as PIL RGB) of row i; (None, []) without images.

    DataError naming the file, row and field (`images[2]`) for an unreadable image or one over
    `max_pixels` pixels (width * height)."""
    column = image_column(row)
    if column is None:
        return None, []
    value = row[column]
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    images = []
    for j, item in enumerate(values):
        field = f"{column}[{j}]" if len(values) > 1 or column == "images" else column

        def where(message, field=field):
            return row_error(path, i, field, message)

        images.append(_open(item, root, where, max_pixels))
    return column, images


def _parts(content: Any) -> list[dict]:
    """A message content as canonical parts: `<image>` placeholders in text become image parts."""
    if isinstance(content, str):
        pieces = content.split(IMAGE_PLACEHOLDER)
        parts: list[dict] = []
        for k, text in enumerate(pieces):
            if k:
                parts.append({"type": "image"})
            if text:
                parts.append({"type": "text", "text": text})
        return parts
    out = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "image" or (isinstance(part, dict) and "image" in part and kind != "text"):
            out.append({"type": "image"})  # an inline image value is dropped: the images column holds them
        elif kind == "text" and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        else:
            raise ValueError(f"content part {str(part)[:60]!r} is neither {{'type': 'image'}} nor "
                             "{'type': 'text', 'text': str}")
    return out


def count_image_parts(messages: list[dict]) -> int:
    """Image parts in canonical messages."""
    return sum(1 for m in messages if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image")


def canonical_messages(prompt: Any, n_images: int, path: str, i: int, field: str) -> list[dict]:
    """The prompt (text, veRL messages with `<image>` or TRL messages with image parts) as
    canonical messages holding exactly `n_images` image parts (see the module's doc for the
    placeholder-free case); DataError naming file, row and field otherwise."""
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise row_error(path, i, field, "expected a non-empty list of messages or a string")
    messages = []
    for j, msg in enumerate(prompt):
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str) or not isinstance(content, (str, list)):
            raise row_error(path, i, field, f"message {j} must be a dict with a string 'role' and a string or "
                                            f"list-of-parts 'content', got {repr(msg)[:80]}")
        try:
            parts = _parts(content)
        except ValueError as exc:
            raise row_error(path, i, field, f"message {j}: {exc}") from None
        has_image = any(p["type"] == "image" for p in parts)
        messages.append({**msg, "content": parts if has_image or isinstance(content, list) else content})
    found = count_image_parts(messages)
    if found == 0 and n_images:
        first = next((m for m in messages if m["role"] == "user"), None)
        if first is None:
            raise row_error(path, i, field, f"{n_images} image(s) but no user message to show them in")
        text = first["content"] if isinstance(first["content"], list) else [{"type": "text", "text": first["content"]}]
        first["content"] = [{"type": "image"} for _ in range(n_images)] + [p for p in text if p.get("text") != ""]
        return messages
    if found != n_images:
        raise row_error(path, i, field, f"the prompt has {found} image placeholder(s) "
                                        f"('{IMAGE_PLACEHOLDER}' or {{'type': 'image'}}) but the row has "
                                        f"{n_images} image(s)")
    return messages


def image_prompt(row: dict, path: str, i: int, prompt_key: str, *, root: str | None,
                 max_pixels: int) -> tuple[list[dict], list] | None:
    """The canonical (messages, images) of an image row, or None for a row without an image
    column (a text row: the text path handles it). Every check of the module's doc runs here."""
    column, images = decode_images(row, path, i, root=root, max_pixels=max_pixels)
    if column is None:
        prompt = row.get(prompt_key)
        if _mentions_images(prompt):
            raise row_error(path, i, prompt_key, f"the prompt has image placeholders but the row has no "
                                                 f"'images' (or 'image') column value")
        return None
    if not images:
        raise row_error(path, i, column, "empty list of images")
    if row.get(prompt_key) is None:
        raise row_error(path, i, prompt_key, "missing")
    return canonical_messages(row[prompt_key], len(images), path, i, prompt_key), images


def _mentions_images(prompt: Any) -> bool:
    """Whether a prompt (text or messages) marks an image position."""
    if isinstance(prompt, str):
        return IMAGE_PLACEHOLDER in prompt
    if isinstance(prompt, (list, tuple)):
        for msg in prompt:
            content = msg.get("content") if isinstance(msg, dict) else None
            if isinstance(content, str) and IMAGE_PLACEHOLDER in content:
                return True
            if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "image" for p in content):
                return True
    return False


def is_processor(tokenizer) -> bool:
    """Whether `tokenizer` is a multimodal processor (it has an image processor): what the
    datasets need to expand an image's placeholder into its image tokens."""
    return getattr(tokenizer, "image_processor", None) is not None


def text_tokenizer(tokenizer):
    """The tokenizer of a processor, or `tokenizer` itself: what encodes text."""
    return tokenizer.tokenizer if is_processor(tokenizer) else tokenizer


def require_processor(tokenizer, path: str, i: int, field: str) -> None:
    """DataError for image row i when `tokenizer` is a plain tokenizer: a text-only model cannot
    see the images (give a vision-language model folder, or drop the image column)."""
    if not is_processor(tokenizer):
        raise row_error(path, i, field, "the row has images but the model has no image processor (it is not a "
                                        "vision-language model: use one, or drop the image column)")


def render_messages(tokenizer, messages: list[dict], path: str, i: int, field: str) -> str:
    """Canonical messages as prompt text through the (processor's) chat template, ending where
    the assistant's reply begins; image parts become the template's image markers."""
    if getattr(tokenizer, "chat_template", None) is None and getattr(text_tokenizer(tokenizer), "chat_template",
                                                                     None) is None:
        raise row_error(path, i, field, "an image prompt needs a chat template, and the tokenizer has none")
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def encode_image_prompt(processor, text: str, images: list) -> tuple[list[int], "Any"]:
    """Token ids of `text` (special tokens as the text writes them) with each image marker
    expanded into the image's tokens, as the processor does for the model's input, and, from
    the same processor call, the prompt's PromptImages
    (models/vlm_inputs.py: pixel_values (N, D), image_grid_thw (K, 3)): what the RL pipeline
    hands the rollout and the log-prob forwards as the prompt's `vision`."""
    from reinforge.models.vlm_inputs import PromptImages

    out = processor(text=[text], images=[list(images)], add_special_tokens=False, return_tensors="pt")
    return out["input_ids"][0].tolist(), PromptImages(out["pixel_values"], out["image_grid_thw"], images=tuple(images))


def thumbnail_uri(image, max_side: int = 128) -> str:
    """A PIL image as a `data:image/png;base64,...` URI, shrunk to at most `max_side` pixels a
    side (a logged sample's picture in the run report)."""
    import base64
    import io

    small = image.copy()
    small.thumbnail((max_side, max_side))
    buf = io.BytesIO()
    small.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def drop_images(messages: list[dict]) -> list[dict]:
    """The messages with their image parts removed (a text-only control on the same prompts)."""
    out = []
    for msg in messages:
        if isinstance(msg["content"], list):
            parts = [p for p in msg["content"] if p["type"] != "image"]
            msg = {**msg, "content": "".join(p["text"] for p in parts)}
        out.append(msg)
    return out
