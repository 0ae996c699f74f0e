"""Turning a row's prompt/response field (plain text or chat messages) into text and ids."""

from __future__ import annotations

from typing import Any

from reinforge.data.io import row_error


def check_messages(value: Any, path: str, row: int, field: str) -> list[dict]:
    """Validate a list of {"role": str, "content": str} messages; returns it."""
    if not value:
        raise row_error(path, row, field, "empty message list")
    for j, msg in enumerate(value):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str) or not isinstance(msg.get("content"), str):
            got = repr(msg)[:80]
            raise row_error(path, row, field, f"message {j} must be a dict with string 'role' and 'content', got {got}")
    return list(value)


def render_prompt(value: Any, tokenizer, path: str, row: int, field: str, tools: list[dict] | None = None) -> str:
    """Prompt text: a string as is, or messages rendered by the tokenizer's chat template.

    Messages are rendered with `add_generation_prompt=True` so the text ends where the
    assistant's reply begins, and with `tools=` (OpenAI function schemas) when `tools` is
    non-empty (the agent loop's hermes format). Missing, empty or wrongly typed values raise
    DataError.
    """
    if value is None:
        raise row_error(path, row, field, "missing")
    if isinstance(value, str):
        if not value.strip():
            raise row_error(path, row, field, "empty prompt")
        return value
    if isinstance(value, (list, tuple)):
        messages = check_messages(value, path, row, field)
        if getattr(tokenizer, "chat_template", None) is None:
            raise row_error(path, row, field, "prompt is a message list but the tokenizer has no chat template")
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                             **({"tools": tools} if tools else {}))
    raise row_error(path, row, field, f"expected a string or a list of messages, got {type(value).__name__}")


def response_text(value: Any, path: str, row: int, field: str) -> str:
    """A response as text: a string, or the content of the last message of a message list."""
    if value is None:
        raise row_error(path, row, field, "missing")
    if isinstance(value, (list, tuple)):
        value = check_messages(value, path, row, field)[-1]["content"]
    if not isinstance(value, str):
        raise row_error(path, row, field, f"expected a string or a list of messages, got {type(value).__name__}")
    if not value.strip():
        raise row_error(path, row, field, "empty response")
    return value


def nonempty_ids(ids: list[list[int]], path: str, field: str) -> list[list[int]]:
    """`ids` (one list per row) unchanged; DataError naming the first row that encodes to no
    tokens: a tokenizer whose vocabulary misses the text (or an empty fallback tokenizer)
    would otherwise train on empty sequences."""
    for row, row_ids in enumerate(ids):
        if not row_ids:
            raise row_error(path, row, field, "encodes to 0 tokens with this tokenizer "
                                              "(does its vocabulary cover the text?)")
    return ids


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens.

    Special tokens are left out because a chat template already writes them (BOS included)
    into the text; encoding them again would duplicate BOS.
    """
    if not texts:
        return []
    return tokenizer(list(texts), add_special_tokens=False)["input_ids"]


def bos_prefix(tokenizer) -> list[int]:
    """The ids the tokenizer puts before a text when it adds its special tokens: Gemma's `<bos>`,
    Llama 3's `<|begin_of_text|>`; none for ChatML models (Qwen, SmolLM2) or the character
    tokenizer. A chat template writes BOS into the text itself, but a plain-text prompt is
    encoded without special tokens (`encode`), so it would reach the model without the BOS every
    training sequence began with (measured on Gemma-3-270M: greedy `12+30=` -> `42` with BOS,
    `30303030` without)."""
    probe = "a"
    full = tokenizer(probe)["input_ids"]
    bare = tokenizer(probe, add_special_tokens=False)["input_ids"]
    for k in range(len(full) - len(bare) + 1):
        if full[k:k + len(bare)] == bare:
            return list(full[:k])
    return []


def with_bos(tokenizer, ids: list[list[int]]) -> list[list[int]]:
    """Each sequence of `ids` starting with the tokenizer's bos_prefix (added where it does not
    already: a chat-rendered prompt that writes BOS keeps its one)."""
    prefix = bos_prefix(tokenizer)
    n = len(prefix)
    return [x if not n or list(x[:n]) == prefix else prefix + list(x) for x in ids]
