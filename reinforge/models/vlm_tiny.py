"""A tiny Qwen2-VL (vision tower + language model) built from config, with a character-level
tokenizer that knows Qwen2-VL's special tokens, and its processor, for tests and the CPU demo.

`save_tiny_vlm(out)` writes a folder that `AutoProcessor` / `AutoModelForImageTextToText` load:
the model (`Qwen2VLForConditionalGeneration`, random-initialised), the tokenizer, the image
processor (Pillow backend: transformers' default one needs torchvision) and the chat template.

Sizes (defaults): vision tower 2 blocks of width 64 on 14x14 patches, 2x2 merge; language
model hidden 256, 4 layers, 4 heads / 2 KV heads (the tiny text model's shape); a vocabulary of
~110 ids (printable ASCII + newline + the special tokens below), so the whole model is ~3.5M
parameters. Images are resized by the processor to a multiple of 28 pixels between
`min_pixels` (56x56: 4 image tokens) and `max_pixels` (default 112x112: 16 image tokens).

The chat template is reinforge's own ChatML with image parts: a `{"type": "image"}` part of a
message renders as `<|vision_start|><|image_pad|><|vision_end|>`, which the processor expands
to one `<|image_pad|>` per merged 2x2 patch group.
"""
from __future__ import annotations

from pathlib import Path

# Special tokens, in id order; pad is id 0 so zero-filled buffers are padding. <|im_end|> ends a
# turn (EOS: the rollout stops on it).
PAD, IM_START, IM_END, UNK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"
VISION_START, VISION_END, VISION_PAD, IMAGE_PAD, VIDEO_PAD = (
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
SPECIAL_TOKENS = [PAD, IM_START, IM_END, UNK, VISION_START, VISION_END, VISION_PAD, IMAGE_PAD, VIDEO_PAD]
# Printable ASCII (space .. ~) plus newline: each character is one token.
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

MIN_PIXELS = 56 * 56
MAX_PIXELS = 112 * 112
VOCABS = ("char", "qwen2")
"""char: the character vocabulary above; qwen2: the released Qwen2 / Qwen2.5 BPE vocabulary
(151,936 rows, models/archs.py's qwen2.5-0.5b tokenizer, whose ids 151652-151656 are Qwen2-VL's
vision tokens as in the released Qwen2-VL tokenizer), with the same chat template."""


def build_vlm_tokenizer():
    """A character-level `PreTrainedTokenizerFast` with Qwen2-VL's special tokens (left padding,
    pad `<|endoftext|>`, EOS `<|im_end|>`, the chat template above)."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    # BPE without merges or pre-tokenizer splits text into characters; special tokens are
    # matched whole first. Fuse joins decoded pieces without spaces.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    core.decoder = decoders.Fuse()
    core.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=IM_END, unk_token=UNK,
                                   padding_side="left", chat_template=CHAT_TEMPLATE,
                                   clean_up_tokenization_spaces=False)


# family -> (config class, processor class): Qwen2-VL and Qwen2.5-VL share the image processor,
# the M-RoPE of images and the language model's layers; Qwen2.5-VL's vision tower has windowed
# attention, RMSNorm and a gated MLP.
FAMILIES = {"qwen2_vl": ("Qwen2VLConfig", "Qwen2VLProcessor", "Qwen2VLForConditionalGeneration"),
            "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLProcessor", "Qwen2_5_VLForConditionalGeneration")}


def qwen2_vlm_tokenizer():
    """The Qwen2.5 tokenizer (real BPE vocabulary, fetched once into the vocab cache) with the
    VLM chat template, EOS `<|im_end|>` and left padding."""
    from transformers import AutoTokenizer

    from reinforge.models.archs import arch_tokenizer_folder

    tok = AutoTokenizer.from_pretrained(str(arch_tokenizer_folder("qwen2.5-0.5b")))
    tok.chat_template, tok.padding_side, tok.eos_token = CHAT_TEMPLATE, "left", IM_END
    return tok


def build_vlm_processor(tokenizer=None, *, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS,
                        family: str = "qwen2_vl"):
    """The family's processor (Qwen2VLProcessor) = the Pillow image processor (patch 14, merge 2,
    temporal patch 2) + `tokenizer` (default `build_vlm_tokenizer()`) + the chat template."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from reinforge.models.vlm_processor import processor_class

    tok = tokenizer if tokenizer is not None else build_vlm_tokenizer()
    image_processor = Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels)
    return processor_class(FAMILIES[family][1])(image_processor=image_processor, tokenizer=tok,
                                                chat_template=CHAT_TEMPLATE)


def tiny_vlm_config(tokenizer, *, hidden_size: int = 256, num_layers: int = 4, num_heads: int = 4,
                    num_kv_heads: int = 2, intermediate_size: int = 704, vision_depth: int = 2,
                    vision_embed_dim: int = 64, vision_heads: int = 4, max_positions: int = 512,
                    family: str = "qwen2_vl"):
    """A `Qwen2VLConfig` (family qwen2_5_vl: `Qwen2_5_VLConfig`) for `tokenizer`: mrope_section
    splits the head dim's rotary frequencies over (temporal, height, width) in the 2:3:3 ratio."""
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"family={family!r}: one of {', '.join(FAMILIES)}")
    config_cls = getattr(transformers, FAMILIES[family][0])

    head_dim = hidden_size // num_heads
    half = head_dim // 2
    if head_dim % 2 or half < 4:
        raise ValueError(f"hidden_size / num_heads must be an even head dim >= 8, got {head_dim}")
    hw = (half * 3) // 8
    section = [half - 2 * hw, hw, hw]
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    # the released Qwen2 vocabulary has 151,936 rows, more than its tokenizer's ids (padding rows)
    text = dict(vocab_size=max(len(tokenizer), 151936 if len(tokenizer) > 150000 else 0), hidden_size=hidden_size, intermediate_size=intermediate_size,
                num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                max_position_embeddings=max_positions, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": section},
                bos_token_id=None, eos_token_id=ids[IM_END], pad_token_id=ids[PAD], tie_word_embeddings=True)
    vision = dict(depth=vision_depth, embed_dim=vision_embed_dim, hidden_size=hidden_size, num_heads=vision_heads,
                  mlp_ratio=2, patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    if family == "qwen2_5_vl":  # width `hidden_size`, output `out_hidden_size`; the last block full attention
        vision = dict(depth=vision_depth, hidden_size=vision_embed_dim, out_hidden_size=hidden_size,
                      intermediate_size=2 * vision_embed_dim, num_heads=vision_heads, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2, in_channels=3, window_size=56,
                      fullatt_block_indexes=[vision_depth - 1])
    return config_cls(text_config=text, vision_config=vision, image_token_id=ids[IMAGE_PAD],
                         video_token_id=ids[VIDEO_PAD], vision_start_token_id=ids[VISION_START],
                         vision_end_token_id=ids[VISION_END], tie_word_embeddings=True,
                         eos_token_id=ids[IM_END], pad_token_id=ids[PAD],
                         architectures=[FAMILIES[family][2]])


def make_tiny_vlm(out_dir: str | None = None, *, seed: int = 0, min_pixels: int = MIN_PIXELS,
                  max_pixels: int = MAX_PIXELS, family: str = "qwen2_vl", vocab: str = "char", **config_kwargs):
    """-> (model, processor): a random-initialised tiny Qwen2-VL (family qwen2_5_vl: Qwen2.5-VL)
    (fp32, HF's own init drawn once under `seed`) and its processor; both saved into `out_dir`
    when given. vocab: `VOCABS`."""
    import torch
    import transformers

    if vocab not in VOCABS:
        raise ValueError(f"vocab={vocab!r}: one of {', '.join(VOCABS)}")
    tok = qwen2_vlm_tokenizer() if vocab == "qwen2" else None
    processor = build_vlm_processor(tok, min_pixels=min_pixels, max_pixels=max_pixels, family=family)
    tok = processor.tokenizer
    config = tiny_vlm_config(tok, family=family, **config_kwargs)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = getattr(transformers, FAMILIES[family][2])(config).float()
    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = None, tok.eos_token_id, tok.pad_token_id
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out_dir)
        from reinforge.models.vlm_processor import save_processor

        save_processor(processor, out_dir)
    return model, processor
