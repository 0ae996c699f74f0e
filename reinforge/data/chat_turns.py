"""A chat conversation as text pieces that are or are not SFT targets: every assistant turn is a
target; what the chat template writes around it (system, user and tool turns, role headers, the
generation prompt) is context.

Turn k's text is the difference between the template's rendering of messages[:k] with the
generation prompt (the text a model continues at inference) and of messages[:k+1]. Its target
ends at the template's last EOS inside it (ChatML's `<|im_end|>`), so what follows the end of
turn (a newline) is context: the model learns to stop where generation stops.
"""
from __future__ import annotations

from reinforge.data.io import row_error


def _render(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)


def assistant_turns(messages: list[dict], tokenizer, path: str, row: int, field: str,
                    first: int = 1) -> list[tuple[str, bool]]:
    """(text, is_target) pieces whose concatenation is the rendered conversation up to the end of
    its last trained turn. Trained: each assistant message at index >= max(first, 1) (one at
    index 0 has no prompt and stays context).

    DataError (naming file, row, field) without a chat template, without a trained assistant
    turn, for an empty assistant message, or when the template does not render the conversation
    turn by turn (an earlier turn's text is not a prefix of the later ones: templates that drop
    past reasoning, for instance).
    """
    from reinforge.data.images import text_tokenizer  # a VLM's processor renders; its tokenizer knows the EOS

    if getattr(tokenizer, "chat_template", None) is None:
        raise row_error(path, row, field, "is a message list but the tokenizer has no chat template")
    eos = text_tokenizer(tokenizer).eos_token or ""
    pieces: list[tuple[str, bool]] = []
    done = ""  # the text the pieces cover so far
    for k in range(max(first, 1), len(messages)):
        if messages[k]["role"] != "assistant":
            continue
        if not messages[k]["content"].strip():
            raise row_error(path, row, field, f"message {k} (assistant) is empty")
        before = _render(tokenizer, messages[:k], True)
        through = _render(tokenizer, messages[: k + 1], False)
        if not (before.startswith(done) and through.startswith(before)):
            raise row_error(path, row, field, f"the chat template does not render message {k} as a continuation of "
                                              "the messages before it, so its tokens cannot be told apart; "
                                              "train on prompt/completion rows instead")
        turn = through[len(before):]
        cut = turn.rfind(eos) + len(eos) if eos and eos in turn else len(turn)
        pieces += [(before[len(done):], False), (turn[:cut], True)]
        done = before + turn[:cut]
    if not any(target for _, target in pieces):
        raise row_error(path, row, field, "no assistant message to train on (one after at least one other message)")
    return [(text, target) for text, target in pieces if text]
