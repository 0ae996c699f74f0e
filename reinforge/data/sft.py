"""SFT dataset (prompt/response or messages rows) and its right-padded collation."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from reinforge.data.collate import pad_right
from reinforge.data.io import DataError, ItemsDataset, require_columns, row_error
from reinforge.data.text import check_messages, encode, nonempty_ids, render_prompt, response_text

if TYPE_CHECKING:  # torch is imported where a batch is built, not at package import
    import torch

SFT_OVERLONG = ("error", "skip", "truncate_right")


def _prompt_and_response(row: dict, tokenizer, path: str, i: int) -> tuple[str, str]:
    """(prompt text, response text); a `messages` row trains on its last (assistant) turn."""
    if "messages" in row and row.get("prompt") is None:
        messages = check_messages(row["messages"], path, i, "messages")
        if len(messages) < 2 or messages[-1]["role"] != "assistant":
            raise row_error(path, i, "messages", "needs at least one message before a final 'assistant' message")
        prompt = render_prompt(messages[:-1], tokenizer, path, i, "messages")
        return prompt, response_text(messages[-1]["content"], path, i, "messages")
    prompt = render_prompt(row.get("prompt"), tokenizer, path, i, "prompt")
    return prompt, response_text(row.get("response"), path, i, "response")


def fit_length(ids: list[int], mask: list[int], max_length: int, policy: str, path: str, i: int):
    """Apply the overlong policy; returns (ids, mask) or None to skip the row."""
    if len(ids) <= max_length:
        return ids, mask
    if policy == "error":
        raise row_error(path, i, "response", f"prompt + response is {len(ids)} tokens > max_length={max_length} "
                        "(set data.overlong=skip or truncate_right)")
    if policy == "skip" or sum(mask[:max_length]) == 0:
        return None  # truncation would leave no response token to learn from
    return ids[:max_length], mask[:max_length]


class SFTDataset(ItemsDataset):
    """Items {"input_ids": list[int] (L_i,), "loss_mask": list[int] (L_i,)}.

    input_ids = prompt ids + response ids + [eos]; loss_mask is 1 on the response tokens and
    the eos (the model must learn to stop), 0 on the prompt. loss_mask[t] marks token t as a
    target, so with next-token logits the trainer uses loss_mask[:, 1:] against input_ids[:, 1:].
    """

    def __init__(self, path: str, tokenizer, *, max_length: int, overlong: str = "error"):
        if overlong not in SFT_OVERLONG:
            raise ValueError(f"overlong must be one of {SFT_OVERLONG}, got {overlong!r}")
        rows = self._read(path, tokenizer, need_eos=True)
        if not any("messages" in row for row in rows):
            require_columns(rows, self.path, ("prompt", "response"),
                            "an SFT file has prompt and response columns, or messages")
        pairs = [_prompt_and_response(row, tokenizer, self.path, i) for i, row in enumerate(rows)]
        prompt_ids = nonempty_ids(encode(tokenizer, [p for p, _ in pairs]), self.path, "prompt")
        response_ids = nonempty_ids(encode(tokenizer, [r for _, r in pairs]), self.path, "response")
        eos = tokenizer.eos_token_id
        self.items, self.num_skipped = [], 0
        for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
            ids, mask = p + r + [eos], [0] * len(p) + [1] * (len(r) + 1)
            fitted = fit_length(ids, mask, max_length, overlong, self.path, i)
            if fitted is None:
                self.num_skipped += 1
                continue
            self.items.append({"input_ids": fitted[0], "loss_mask": fitted[1]})
        if not self.items:
            raise DataError(f"{os.path.basename(self.path)}: no row fits data.max_length={max_length}")


def collate_sft(items: list[dict], pad_id: int) -> dict[str, "torch.Tensor"]:
    """Right-padded batch: input_ids, attention_mask, loss_mask, each (B, L) int64."""
    input_ids = pad_right([it["input_ids"] for it in items], pad_id)
    attention_mask = pad_right([[1] * len(it["input_ids"]) for it in items], 0)
    loss_mask = pad_right([it["loss_mask"] for it in items], 0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}
