"""RL prompt dataset: veRL's schema or TRL's simpler one, validated up front."""

from __future__ import annotations

from typing import Any

from reinforge.data.hf_datasets import source_name
from reinforge.data.images import (DEFAULT_MAX_PIXELS, IMAGE_COLUMNS, base_dir, encode_image_prompt, has_images,
                                   image_prompt, render_messages, require_processor, text_tokenizer)
from reinforge.data.io import DataError, ItemsDataset, file_label, require_columns, row_error
from reinforge.data.text import encode, nonempty_ids, render_prompt, with_bos

GROUND_TRUTH_COLUMNS = ("ground_truth", "answer", "solution")  # TRL-style, tried in this order
OVERLONG_POLICIES = ("error", "skip", "truncate_left")
# A reward function is called fn(prompt, response, ground_truth, **extra): columns with these
# names (an SFT file's "response") must not reach it as extras, or every call fails.
REWARD_ARGS = ("prompt", "response", "ground_truth")


def _ground_truth(row: dict, path: str, i: int, required: bool) -> tuple[Any, str | None]:
    """(ground truth, the column it came from) from veRL's reward_model or a TRL column."""
    rm = row.get("reward_model")
    if isinstance(rm, dict) and rm.get("ground_truth") is not None:
        gt, column = rm["ground_truth"], "reward_model"
    else:
        column = next((c for c in GROUND_TRUTH_COLUMNS if row.get(c) is not None), None)
        gt = row[column] if column else None
    if required and (gt is None or (isinstance(gt, str) and not gt.strip())):
        field = "reward_model.ground_truth" if "reward_model" in row else "ground_truth"
        looked = ", ".join(("reward_model.ground_truth",) + GROUND_TRUTH_COLUMNS)
        raise row_error(path, i, field, f"missing or empty (looked in {looked})")
    return gt, column


class RLDataset(ItemsDataset):
    """Prompts for RL with their ground truth, tokenized once at construction.

    Items: {"prompt_text": str, "prompt_ids": list[int] (P_i,), "ground_truth": Any,
    "data_source": str, "extra": dict, "index": int (row in the file), "prompt_raw": the prompt
    column's value as read (a string or a list of messages: what rollout.agent's row holds)}.
    `extra` holds every other column (veRL's `extra_info`, `ability`, ...) plus `data_source`,
    and is passed to reward functions as keyword arguments (columns named like their positional
    arguments, REWARD_ARGS, are left out).
    Overlong prompts (> max_prompt_length tokens): "error" raises, "skip" drops and counts them
    in `num_skipped`, "truncate_left" keeps the last max_prompt_length tokens (the end of a
    prompt, next to where the answer starts, matters most). `length_key` is the config key that
    set max_prompt_length, named in the errors (SFT/DPO eval prompts: eval.max_prompt_length).
    `tools(row's tools column or None) -> [OpenAI tool schema]`: the tools a message prompt is
    rendered with (rollout.tool_parser=hermes; reinforge.agents.loop.prompt_tools).

    Image rows (veRL's or TRL's schema, reinforge.data.images) need a processor as `tokenizer`;
    their items also hold "prompt_messages" and "images", the canonical (messages, PIL RGB
    images) of the prompt, "vision" (its PromptImages, models/vlm_inputs.py: the pixels the
    rollout and the log-prob forwards take), and their prompt_ids have each image's tokens expanded (so
    max_prompt_length counts them). An image over `max_pixels` (data.max_pixels), an unreadable
    one or a placeholder count that does not match the images is a DataError naming the row.
    An image prompt is never truncated: "truncate_left" treats it as "error".
    """

    def __init__(
        self,
        path: str,
        tokenizer,
        *,
        max_prompt_length: int,
        overlong_prompt: str = "error",
        prompt_key: str = "prompt",
        require_ground_truth: bool = True,
        length_key: str = "data.max_prompt_length",
        tools=None,
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ):
        if overlong_prompt not in OVERLONG_POLICIES:
            raise ValueError(f"overlong_prompt must be one of {OVERLONG_POLICIES}, got {overlong_prompt!r}")
        rows = self._read(path)
        require_columns(rows, self.path, (prompt_key,), "set data.prompt_key to the prompt column")
        default_source = source_name(self.path)
        root = base_dir(self.path) if has_images(rows) else None
        # Validate every row before tokenizing anything, so a bad row 90,000 fails in seconds.
        texts, meta, visual = [], [], {}
        for i, row in enumerate(rows):
            schemas = tools(row.get("tools")) if tools is not None else None
            image_row = image_prompt(row, self.path, i, prompt_key, root=root, max_pixels=max_pixels) \
                if root is not None else None
            if image_row is None:
                texts.append(render_prompt(row.get(prompt_key), text_tokenizer(tokenizer), self.path, i, prompt_key,
                                           schemas))
            else:
                visual[i] = image_row
                texts.append(None)  # rendered below, once every row's images passed their checks
            gt, gt_col = _ground_truth(row, self.path, i, require_ground_truth)
            source = row.get("data_source")
            if source is not None and not isinstance(source, str):
                raise row_error(self.path, i, "data_source", f"expected a string, got {type(source).__name__}")
            # The images stay out of the reward's keyword arguments (they travel to reward workers).
            skip = {prompt_key, "reward_model", gt_col, *REWARD_ARGS, *(IMAGE_COLUMNS if i in visual else ())}
            extra = {k: v for k, v in row.items() if k not in skip}
            extra["data_source"] = source or default_source
            meta.append((gt, extra, row.get(prompt_key)))
        for i, (messages, _) in visual.items():
            require_processor(tokenizer, self.path, i, prompt_key)
            texts[i] = render_messages(tokenizer, messages, self.path, i, prompt_key)
        self.num_skipped = 0
        self.items: list[dict] = []
        all_ids = encode(text_tokenizer(tokenizer), texts)
        vision = {}  # row -> PromptImages: the pixels the rollout and the log-prob forwards see
        for i, (messages, images) in visual.items():
            all_ids[i], vision[i] = encode_image_prompt(tokenizer, texts[i], images)
        all_ids = with_bos(text_tokenizer(tokenizer), nonempty_ids(all_ids, self.path, prompt_key))
        for i, (text, ids, (gt, extra, raw)) in enumerate(zip(texts, all_ids, meta)):
            if len(ids) > max_prompt_length:
                if overlong_prompt == "error" or (i in visual and overlong_prompt == "truncate_left"):
                    raise row_error(
                        self.path, i, prompt_key,
                        f"prompt has {len(ids)} tokens > {length_key}={max_prompt_length} "
                        + ("(raise it; an image prompt is never truncated, data.overlong_prompt=skip drops it)"
                           if i in visual and length_key.startswith("data.")
                           else "(raise it, or set data.overlong_prompt=skip or truncate_left)"
                           if length_key.startswith("data.") else "(raise it)"),
                    )
                if overlong_prompt == "skip":
                    self.num_skipped += 1
                    continue
                ids = ids[-max_prompt_length:]
                text = text_tokenizer(tokenizer).decode(ids)
            self.items.append(
                {"prompt_text": text, "prompt_ids": list(ids), "ground_truth": gt,
                 "data_source": extra["data_source"], "extra": extra, "index": i, "prompt_raw": raw}
            )
            if i in visual:
                self.items[-1]["prompt_messages"], self.items[-1]["images"] = visual[i]
                self.items[-1]["vision"] = vision[i]
        if not self.items:
            raise DataError(f"{file_label(self.path)}: every prompt is longer than "
                            f"{length_key}={max_prompt_length} tokens")

