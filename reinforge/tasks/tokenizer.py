"""A real character-level Hugging Face tokenizer for the built-in tasks.

Built with the `tokenizers` library so that everything downstream (padding, `save_pretrained`,
`AutoTokenizer.from_pretrained`, chat templates, `decode(skip_special_tokens=True)`) behaves
exactly as with a pretrained LLM tokenizer; only the vocabulary is tiny (~100 symbols), which
keeps the tiny demo models small.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIAL_TOKENS = [PAD, EOS, UNK]  # ids 0, 1, 2: pad first so zero-initialised buffers are padding
# Printable ASCII (space .. ~) plus newline, so chat templates and multi-line prompts round-trip.
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]

# Concatenates message contents: a single user message renders to exactly its text, so a
# chat-form prompt and the same plain-text prompt give identical token ids.
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def build_char_tokenizer(save_dir: str | None = None) -> PreTrainedTokenizerFast:
    """Return a character-level `PreTrainedTokenizerFast` (left padding, `<pad>`/`<eos>`/`<unk>`).

    Each printable ASCII character is one token; unknown characters map to `<unk>`.
    If `save_dir` is given the tokenizer is also written there with `save_pretrained`.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    assert len(vocab) == len(SPECIAL_TOKENS) + len(CHARS), "duplicate symbol in vocabulary"
    # A BPE model with no merges and no pre-tokenizer splits text into single characters;
    # Fuse joins decoded tokens without the spaces the default decoder would insert.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.decoder = decoders.Fuse()
    core.add_special_tokens(SPECIAL_TOKENS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    if save_dir is not None:
        tok.save_pretrained(save_dir)
    return tok

