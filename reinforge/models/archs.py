"""Real architectures at their real shapes, random-initialised, with their real tokenizers.

`ARCHS` is the table (pure data: the published config values of each model); `build_arch(name)`
builds one: `arch_config` (the HF config), `arch_tokenizer` (the tokenizer folder) and the
model, random-initialised once (`reinforge model --arch NAME OUT` saves both).

The tokenizers come from the vocab-only GGUF files of models/vocabs.py (their BPE vocabularies
and merges are the released ones: "Hello world" encodes to the released ids, tests/
test_real_vocab.py), adjusted where the GGUF differs from the released tokenizer:
- Qwen2's GGUF is the Qwen1.5 / Qwen2 vocabulary: ids 151646-151935 are placeholders
  (`[PAD151646]`, ...). Qwen2.5 and Qwen3 use the same BPE and name some of them: their names
  are restored at their ids (`<tool_call>` = 151657, Qwen3's `<think>` = 151667, ...),
  so a tool call or a think tag is one token as in the released tokenizers.
- Llama 3's GGUF names 128002-128255 `<|reserved_special_token_N|>` (the 3.0 names) and the
  conversion adds an `<|endoftext|>` at 128256, beyond the model's 128,256 rows: the 3.1 / 3.2
  names are restored (`<|eom_id|>`, `<|python_tag|>`, `<|finetune_right_pad_id|>`, the pad
  token here) and the extra id dropped; BOS is prepended on encoding, as Llama 3's does.
- Chat templates are reinforge's own (models/chat_templates.py): Qwen2's GGUF template is plain
  ChatML without tools, Llama 3's GGUF has none.
EOS stays the GGUF's (`<|endoftext|>`, `<|end_of_text|>`: the base models'); a turn's end
(`<|im_end|>`, `<|eot_id|>`) is a stop token because the rollout reads it from the chat
template (workers/rollout/common.stop_token_ids).

`layers` and `hidden` shrink a model for tests (the vocabulary, tied head, GQA, rope and norms
stay real): see `arch_config`.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from reinforge.models.chat_templates import TEMPLATES
from reinforge.models.vocabs import SDIST_VERSION, cache_root, cached_folder, vocab_folder

_QWEN25_ADDED = ((151646, "<|object_ref_start|>", True), (151647, "<|object_ref_end|>", True),
                 (151648, "<|box_start|>", True), (151649, "<|box_end|>", True), (151650, "<|quad_start|>", True),
                 (151651, "<|quad_end|>", True), (151652, "<|vision_start|>", True), (151653, "<|vision_end|>", True),
                 (151654, "<|vision_pad|>", True), (151655, "<|image_pad|>", True), (151656, "<|video_pad|>", True),
                 (151657, "<tool_call>", False), (151658, "</tool_call>", False), (151659, "<|fim_prefix|>", False),
                 (151660, "<|fim_middle|>", False), (151661, "<|fim_suffix|>", False), (151662, "<|fim_pad|>", False),
                 (151663, "<|repo_name|>", False), (151664, "<|file_sep|>", False))
_QWEN3_ADDED = _QWEN25_ADDED + ((151665, "<tool_response>", False), (151666, "</tool_response>", False),
                                (151667, "<think>", False), (151668, "</think>", False))
_LLAMA32_ADDED = ((128004, "<|finetune_right_pad_id|>", True), (128008, "<|eom_id|>", True),
                  (128010, "<|python_tag|>", True))


@dataclass(frozen=True)
class Arch:
    """One architecture: its HF model type, config values, vocabulary and tokenizer changes."""
    model_type: str                 # "qwen2" | "qwen3" | "llama" | "qwen3_moe" | "qwen2_moe"
    vocab: str                      # a models/vocabs.py name
    template: str                   # a chat_templates.TEMPLATES name
    config: dict                    # the HF config's values (real shape)
    added: tuple = ()               # (id, content, special): placeholders renamed to these
    pad_token: str | None = None    # None: the GGUF's
    add_bos: bool = False           # encoding prepends BOS
    drop_ids_from: int | None = None  # added ids >= this are dropped (beyond the model's rows)
    about: str = ""


ARCHS: dict[str, Arch] = {
    "qwen2.5-0.5b": Arch(
        "qwen2", "qwen2", "chatml_tools",
        dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
             intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6,
             rms_norm_eps=1e-6, max_position_embeddings=32768, hidden_act="silu"),
        added=_QWEN25_ADDED, about="Qwen2.5-0.5B (494M parameters)"),
    "qwen3-0.6b": Arch(
        "qwen3", "qwen2", "qwen3",
        dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
             intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6,
             rms_norm_eps=1e-6, max_position_embeddings=40960, attention_bias=False, hidden_act="silu"),
        added=_QWEN3_ADDED, about="Qwen3-0.6B (596M parameters)"),
    "llama-3.2-1b": Arch(
        "llama", "llama-bpe", "llama3",
        dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
             intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True, rms_norm_eps=1e-5,
             max_position_embeddings=131072, hidden_act="silu", attention_bias=False, mlp_bias=False,
             rope_theta=500000.0,
             rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 8192}),
        added=_LLAMA32_ADDED, pad_token="<|finetune_right_pad_id|>", add_bos=True, drop_ids_from=128256,
        about="Llama-3.2-1B (1.24B parameters)"),
    # Mixture-of-experts (models/moe.py): the released models' layout (vocabulary, tokenizer, chat
    # template, GQA, q/k norms or qkv bias, top-k renormalisation, shared expert) at a tiny size,
    # with a tied head (the released ones untie it) so the 152k-row embedding is paid once.
    "qwen3-moe-tiny": Arch(
        "qwen3_moe", "qwen2", "qwen3",
        dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             intermediate_size=384, moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2,
             norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936,
             tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=40960,
             attention_bias=False, hidden_act="silu"),
        added=_QWEN3_ADDED, about="a tiny Qwen3-MoE (Qwen3-30B-A3B's layout: top-k renormalised; 8 experts, top-2)"),
    "qwen2-moe-tiny": Arch(
        "qwen2_moe", "qwen2", "chatml_tools",
        dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
             intermediate_size=384, moe_intermediate_size=64, shared_expert_intermediate_size=256, num_experts=8,
             num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
             vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6, rms_norm_eps=1e-6,
             max_position_embeddings=32768, qkv_bias=True, hidden_act="silu"),
        added=_QWEN25_ADDED, about="a tiny Qwen2-MoE (Qwen1.5-MoE-A2.7B's layout: a gated shared expert, top-k not "
                                   "renormalised; 8 experts, top-2)"),
}


# Vision-language architectures: built by models/vlm_tiny.py (its own small vocabulary, a
# Qwen2VLProcessor saved beside the model), not from a GGUF vocabulary.
VLM_ARCHS: dict[str, str] = {
    "qwen2-vl-tiny": "a tiny Qwen2-VL (Qwen2VLForConditionalGeneration: 2-block vision tower, 4-layer LM, "
                     "hidden 256, ~3.3M parameters), character vocabulary with Qwen2-VL's special tokens, "
                     "images 56x56 to 112x112 pixels (4 to 16 image tokens)",
    "qwen2.5-vl-tiny": "the same with Qwen2.5-VL's classes (Qwen2_5_VLForConditionalGeneration: windowed "
                       "vision attention, gated vision MLP)",
}
_VLM_FAMILY = {"qwen2-vl-tiny": "qwen2_vl", "qwen2.5-vl-tiny": "qwen2_5_vl"}


def _arch(name: str) -> Arch:
    if name not in ARCHS:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join([*ARCHS, *VLM_ARCHS])}")
    return ARCHS[name]


def _small_shape(cfg: dict, hidden: int) -> dict:
    """The shape at width `hidden` (a multiple of 8): head dim the largest even divisor of
    hidden up to min(real head dim, hidden // 4), heads hidden // head dim, KV heads in the real
    ratio (at least 1, dividing the heads), MLP width in the real ratio (a multiple of 8)."""
    if hidden == cfg["hidden_size"]:
        return {}
    if hidden < 8 or hidden % 8:
        raise ValueError(f"hidden must be a multiple of 8 (>= 8), got {hidden}")
    heads = cfg["num_attention_heads"]
    cap = min(cfg.get("head_dim") or cfg["hidden_size"] // heads, hidden // 4)
    head_dim = max(d for d in range(2, cap + 1, 2) if hidden % d == 0)
    n = hidden // head_dim
    kv = max(1, n * cfg["num_key_value_heads"] // heads)
    while n % kv:
        kv -= 1
    inter = max(8, round(hidden * cfg["intermediate_size"] / cfg["hidden_size"] / 8) * 8)
    out = dict(hidden_size=hidden, num_attention_heads=n, num_key_value_heads=kv, head_dim=head_dim,
               intermediate_size=inter)
    for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):  # MoE widths, same ratio
        if key in cfg:
            out[key] = max(8, round(hidden * cfg[key] / cfg["hidden_size"] / 8) * 8)
    return out


def arch_config(name: str, *, layers: int | None = None, hidden: int | None = None, **overrides):
    """The HF config of architecture `name` (ValueError naming the known ones otherwise).

    layers: the decoder layer count (default: the real one); hidden: a smaller width for tests
    (heads, KV heads, head dim and MLP width follow, see `_small_shape`); overrides: any other
    config value. Token ids (bos / eos / pad) are the tokenizer's (`arch_tokenizer`)."""
    from transformers import AutoConfig

    spec = _arch(name)
    values = dict(spec.config)
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        values["num_hidden_layers"] = layers
    if hidden is not None:
        values.update(_small_shape(spec.config, hidden))
    values.update(overrides)
    tok = _token_ids(name)
    return AutoConfig.for_model(spec.model_type, **values, **tok,
                                architectures=[_MODEL_CLASSES[spec.model_type]])


_MODEL_CLASSES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM",
                  "qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}


def _token_ids(name: str) -> dict:
    """bos / eos / pad ids of the arch's tokenizer (written beside it when the folder is built)."""
    return json.loads((arch_tokenizer_folder(name) / "token_ids.json").read_text())


def _spec_hash(spec: Arch) -> str:
    blob = json.dumps([spec.vocab, spec.added, spec.pad_token, spec.add_bos, spec.drop_ids_from,
                       TEMPLATES[spec.template]])
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def arch_tokenizer_folder(name: str) -> Path:
    """The cached tokenizer folder of architecture `name` (built from its GGUF vocabulary on
    first use, atomically, under the vocab cache: `<cache>/vocabs/arch-<name>-<version>-<hash>`,
    the hash covering the changes above so an edit here rebuilds it)."""
    spec = _arch(name)
    return cached_folder(cache_root() / f"arch-{name}-{SDIST_VERSION}-{_spec_hash(spec)}",
                         lambda tmp, out: _write_tokenizer(spec, vocab_folder(spec.vocab), out))


def _write_tokenizer(spec: Arch, src: Path, out: Path) -> None:
    """Copy the GGUF tokenizer folder `src` to `out` with the arch's tokens, template and pad."""
    out.mkdir(parents=True)
    tj = json.loads((src / "tokenizer.json").read_text())
    by_id = {t["id"]: t for t in tj["added_tokens"]}
    vocab = tj["model"]["vocab"]
    for tid, content, special in spec.added:
        old = by_id[tid]["content"]
        by_id[tid].update(content=content, special=special)
        if vocab.get(old) == tid:  # the placeholder is a vocabulary entry too
            del vocab[old]
            vocab[content] = tid
    if spec.drop_ids_from is not None:
        tj["added_tokens"] = [t for t in tj["added_tokens"] if t["id"] < spec.drop_ids_from]
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    if spec.add_bos:
        bos = cfg["bos_token"]
        piece = {"SpecialToken": {"id": bos, "type_id": 0}}
        tj["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [piece, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [piece, {"Sequence": {"id": "A", "type_id": 0}}, piece, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [_added_id(tj, bos)], "tokens": [bos]}}}
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    if spec.pad_token is not None:
        cfg["pad_token"] = spec.pad_token
    for k in ("is_local", "local_files_only"):
        cfg.pop(k, None)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    (out / "chat_template.jinja").write_text(TEMPLATES[spec.template])
    ids = {t["content"]: t["id"] for t in tj["added_tokens"]}
    (out / "token_ids.json").write_text(json.dumps({f"{k}_token_id": ids.get(cfg.get(f"{k}_token"))
                                                    for k in ("bos", "eos", "pad")}))


def _added_id(tj: dict, content: str) -> int:
    return next(t["id"] for t in tj["added_tokens"] if t["content"] == content)


def arch_tokenizer(name: str):
    """The tokenizer of architecture `name`, loaded from `arch_tokenizer_folder`."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(arch_tokenizer_folder(name)))


def build_model(name: str, layers: int | None = None, hidden: int | None = None, *, seed: int = 0, **overrides):
    """Architecture `name` random-initialised (HF's own init, drawn once under `seed`), fp32;
    its generation config's bos / eos / pad are the tokenizer's."""
    import torch
    from transformers import AutoModelForCausalLM

    config = arch_config(name, layers=layers, hidden=hidden, **overrides)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = config.bos_token_id, config.eos_token_id, config.pad_token_id
    return model


def build_arch(name: str, layers: int | None = None, hidden: int | None = None, *, seed: int = 0, **overrides):
    """-> (model, tokenizer): `build_model` and `arch_tokenizer`."""
    return build_model(name, layers, hidden, seed=seed, **overrides), arch_tokenizer(name)


def save_arch(name: str, out_dir: str, layers: int | None = None, hidden: int | None = None, *, seed: int = 0,
              **overrides):
    """`build_model` saved into `out_dir` with the tokenizer folder's files copied beside it
    (the tokenizer is not loaded: that alone takes seconds for a 152k vocabulary). -> the model.
    A VLM_ARCHS name writes models/vlm_tiny.make_tiny_vlm's folder (model + processor); its
    overrides: max_pixels / min_pixels (the image processor's budget) and tiny_vlm_config's."""
    if name in VLM_ARCHS:
        from reinforge.models.vlm_tiny import make_tiny_vlm

        kw = {k: v for k, v in dict(num_layers=layers, hidden_size=hidden).items() if v}
        return make_tiny_vlm(out_dir, seed=seed, family=_VLM_FAMILY[name], **kw, **overrides)[0]
    model = build_model(name, layers, hidden, seed=seed, **overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    for f in arch_tokenizer_folder(name).iterdir():
        if f.name != "token_ids.json":
            shutil.copyfile(f, out / f.name)
    return model


def describe() -> list[str]:
    """One line an architecture: name, what it is, its vocabulary."""
    return [f"{n}: {a.about}, {a.config['num_hidden_layers']} layers, hidden {a.config['hidden_size']}, "
            f"vocabulary {a.config['vocab_size']} ({a.vocab})" for n, a in ARCHS.items()] + \
        [f"{n}: {about}" for n, about in VLM_ARCHS.items()]
