"""Load Hugging Face models and tokenizers from local folders: the actor (causal LM), its frozen
reference copy, the critic (the same backbone as a token classifier with one label, seed 000),
and a sequence-classification reward model.

A vision-language folder (its config.json has a `vision_config`: Qwen2-VL and kin) loads
through `AutoModelForImageTextToText` wherever a causal LM is asked for (actor, reference,
SFT, DPO), its vision tower frozen unless `freeze_vision_tower=False` (model.freeze_vision_tower);
`load_vlm_processor` gives its processor (models/vlm_processor.py). As a critic or a reward
model it is the backbone with a scalar head (models/vlm_critic.py), its tower frozen alike.

Each loader takes a local folder or a Hub id (`org/name[@revision]`, resolved to its snapshot in
the Hugging Face cache by reinforge.models.hub); transformers itself never downloads
(`local_files_only=True`).
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedModel,
)

from reinforge.models.checks import ModelLoadError, check_tokenizer_files, corrupt_weight_file
from reinforge.models.hub import resolve_model_path

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """`auto` is fp32 on CPU (bf16 matmuls are slow there) and bf16 on GPU."""
    if name == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if name not in DTYPES:
        raise ModelLoadError(f"model.dtype={name!r} is not known; valid: {['auto', *DTYPES]}")
    return DTYPES[name]


def _check_folder(path: str) -> str:
    """The local model folder of `path` (a folder or a Hub id); ModelLoadError if it has no config.json."""
    path = resolve_model_path(path, "model path")
    if not path or not Path(path).is_dir():
        raise ModelLoadError(f"model folder {path!r} does not exist")
    if not (Path(path) / "config.json").exists():
        raise ModelLoadError(f"{path!r} is not a Hugging Face model folder (no config.json)")
    return path


def _from_pretrained(load, path: str, *args, **kwargs):
    """`load(path, ...)` (a from_pretrained); when it fails and a weight file of `path` is
    unsound, ModelLoadError names that file instead of the loader's traceback."""
    try:
        return load(path, *args, **kwargs)
    except Exception as exc:
        try:
            bad = corrupt_weight_file(path)
        except ModelLoadError as missing:
            raise missing from exc
        if bad is None:
            raise
        raise ModelLoadError(f"weight file {bad[0]} is corrupt: {bad[1]}") from exc


def load_tokenizer(path: str, trust_remote_code: bool = False):
    """Tokenizer with a pad token (EOS when the model has none) and left padding for generation."""
    path = resolve_model_path(path, "tokenizer path")
    if not path or not Path(path).is_dir():
        raise ModelLoadError(f"tokenizer folder {path!r} does not exist")
    check_tokenizer_files(path, "tokenizer folder", trust_remote_code)
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True)
    except Exception as exc:  # tokenizers, sentencepiece and transformers raise many types
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ModelLoadError(f"tokenizer at {path!r} cannot be loaded: {type(exc).__name__}: {first}") from exc
    if tok.pad_token_id is None:
        if tok.eos_token_id is None:
            raise ModelLoadError(f"tokenizer at {path!r} has neither a pad nor an EOS token")
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


_TURN_SENTINEL = "\u2063REINFORGE_TURN\u2063"


def turn_end_ids(tokenizer) -> list[int]:
    """The special token a chat template closes an assistant turn with (ChatML's `<|im_end|>`,
    Llama 3's `<|eot_id|>`), as a list of at most one id; [] without a template, when the
    template writes no special token right after the assistant's content, or cannot render.

    Why: a tokenizer's EOS need not end a turn (Qwen2's is `<|endoftext|>`, its chat turns end
    with `<|im_end|>`), and a base model's generation config names only that EOS; a rollout
    stopping at EOS alone would run every chat reply on to the length limit.
    """
    if not getattr(tokenizer, "chat_template", None):
        return []
    conv = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _TURN_SENTINEL}]
    try:
        text = tokenizer.apply_chat_template(conv, tokenize=False)
    except Exception:  # a template may refuse this conversation (raise_exception): then no turn end is known
        return []
    if _TURN_SENTINEL not in text:
        return []
    closing = text[text.index(_TURN_SENTINEL) + len(_TURN_SENTINEL):]
    ids = tokenizer(closing, add_special_tokens=False)["input_ids"] if closing else []
    if not ids:
        return []
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special = ids[0] in set(tokenizer.all_special_ids) or (ids[0] in added and added[ids[0]].special)
    return [ids[0]] if special else []


def checkpointing_on(value) -> bool:
    """A loader's gradient_checkpointing: a bool, or model.gradient_checkpointing as the run's plan
    resolved it ("true" / "false"; an unresolved `auto`, outside a plan, is off as it always was)."""
    if isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v == "auto":
        return False
    if v not in ("true", "false"):
        raise ValueError(f"gradient_checkpointing={value!r}: resolve model.gradient_checkpointing (auto) "
                         "with the run's plan first")
    return v == "true"


def enable_checkpointing(model: PreTrainedModel) -> None:
    """Activation checkpointing of every decoder layer through the model's own switch, non-reentrant
    (torch.utils.checkpoint with use_reentrant=False: gradients reach inputs passed by keyword and
    frozen embeddings, and the recompute runs under the forward's autocast state)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x; the old name warns there
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False


def _finish(model: PreTrainedModel, device: str, gradient_checkpointing, train: bool) -> PreTrainedModel:
    model.to(device)
    if checkpointing_on(gradient_checkpointing):
        enable_checkpointing(model)
    model.train(train)
    if not train:
        model.requires_grad_(False)
    return model


def load_causal_lm(path: str, *, dtype: str = "auto", device: str = "cpu", gradient_checkpointing: bool | str = False,
                   trust_remote_code: bool = False, attn_implementation: str = "sdpa",
                   train: bool = True, freeze_vision_tower: bool = True) -> PreTrainedModel:
    """Actor (train=True) or reference (train=False: eval mode, no gradients). A VLM folder
    loads as an image-text-to-text model (module docstring)."""
    path = _check_folder(path)
    from reinforge.models.vlm_processor import is_vlm_folder

    vlm = is_vlm_folder(path)
    if vlm:
        from transformers import AutoModelForImageTextToText as auto
    else:
        auto = AutoModelForCausalLM
    model = _from_pretrained(
        auto.from_pretrained, path, dtype=resolve_dtype(dtype, device),
        trust_remote_code=trust_remote_code, attn_implementation=attn_implementation, local_files_only=True)
    model = _finish(model, device, checkpointing_on(gradient_checkpointing) and train, train)
    if vlm and train and freeze_vision_tower:
        freeze_vision(model)
    if train:  # a tied embedding's lookup gradient added in place, not as a second (V, H) tensor
        from reinforge.models.tied_lookup import tie_lookup

        tie_lookup(model)
    return model


def vision_tower(model):
    """The vision encoder module of a VLM (Qwen2-VL's `model.visual`), or None."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(getattr(inner, "model", None), "visual", None)


def freeze_vision(model) -> None:
    """No gradients for the vision tower (its patch merger included): RL and SFT then train the
    language model only, and the encoder runs under no_grad (models/vlm_forward.py)."""
    tower = vision_tower(model)
    if tower is None:
        raise ModelLoadError("model.freeze_vision_tower: the model has no vision tower (model.visual)")
    tower.requires_grad_(False)


def load_vlm_processor(path: str):
    """The processor (image processor + tokenizer + chat template) of a VLM folder, its
    tokenizer left-padding; ModelLoadError naming the folder when it cannot be built."""
    path = resolve_model_path(path, "processor path")
    from reinforge.models.vlm_processor import load_processor

    try:
        proc = load_processor(path)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ModelLoadError(f"processor at {path!r} cannot be loaded: {type(exc).__name__}: {first}") from exc
    proc.tokenizer.padding_side = "left"
    return proc


def load_critic(path: str, *, dtype: str = "auto", device: str = "cpu", gradient_checkpointing: bool | str = False,
                trust_remote_code: bool = False, attn_implementation: str = "sdpa",
                reinit_head: bool = False, freeze_vision_tower: bool = True) -> PreTrainedModel:
    """The value model: `<Arch>ForTokenClassification` with one label on the backbone at `path`.
    A VLM folder gives models/vlm_critic.VisionValueModel (its head initialised the same way),
    its vision tower frozen unless `freeze_vision_tower=False`.

    From a causal LM (SFT policy) the backbone is copied and the value head is new. From a reward
    model (`<Arch>ForSequenceClassification`, one label) the head is kept too, unless
    `reinit_head`: the RM already maps the last hidden state to a scalar on the reward's scale,
    which is a better start for a value than a random head (seed 004, critic initialisation).
    """
    path = _check_folder(path)
    from reinforge.models.vlm_processor import is_vlm_folder

    if is_vlm_folder(path):
        from reinforge.models.vlm_critic import load_vlm_critic

        model = load_vlm_critic(path, dtype=resolve_dtype(dtype, device), trust_remote_code=trust_remote_code,
                                attn_implementation=attn_implementation, reinit_head=reinit_head, load=_from_pretrained)
        model = _finish(model, device, gradient_checkpointing, True)
        if freeze_vision_tower:
            freeze_vision(model)
        return model
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code, local_files_only=True)
    arch = (config.architectures or [""])[0]
    # A reward model's head, or a pretrained critic's (VAPO value pretraining), is kept.
    from_rm = arch.endswith("ForSequenceClassification") and not reinit_head
    from_critic = arch.endswith("ForTokenClassification") and not reinit_head
    config.num_labels = 1
    config.classifier_dropout = 0.0  # dropout on values makes targets noisy; the critic wants none
    # A sequence-classification head has no bias; match it so the RM's head loads as the value head.
    if not from_critic:
        config.token_classification_bias = not from_rm
    model = _from_pretrained(
        AutoModelForTokenClassification.from_pretrained, path, config=config, dtype=resolve_dtype(dtype, device),
        trust_remote_code=trust_remote_code, attn_implementation=attn_implementation, local_files_only=True,
        ignore_mismatched_sizes=True)
    if not (from_rm or from_critic):
        # A small head keeps the initial values near zero, so early advantages are not dominated
        # by a random value function.
        torch.nn.init.normal_(model.score.weight, std=1e-3)
        if model.score.bias is not None:
            torch.nn.init.zeros_(model.score.bias)
    return _finish(model, device, gradient_checkpointing, True)


def load_reward_model(path: str, *, dtype: str = "auto", device: str = "cpu", trust_remote_code: bool = False,
                      attn_implementation: str = "sdpa", gradient_checkpointing: bool | str = False,
                      train: bool = False, freeze_vision_tower: bool = True) -> PreTrainedModel:
    """A sequence classifier with one label (Bradley-Terry reward model): frozen for scoring, or
    trainable (`train`, reinforge rm: from a causal LM the backbone loads and the head is new).
    A VLM folder gives models/vlm_critic.VisionValueModel with a bias-free head (kept from an
    earlier reward model, new from a policy; scoring needs a trained one), its vision tower
    frozen in training unless `freeze_vision_tower=False`."""
    path = _check_folder(path)
    from reinforge.models.vlm_processor import is_vlm_folder

    if is_vlm_folder(path):
        from reinforge.models.vlm_critic import HEAD_FILE, load_vlm_reward_model

        if not train and not (Path(path) / HEAD_FILE).is_file():
            raise ModelLoadError(f"{path!r} is a vision-language model without a reward head ({HEAD_FILE}): "
                                 "train one with `reinforge rm`")
        model = load_vlm_reward_model(path, dtype=resolve_dtype(dtype, device), trust_remote_code=trust_remote_code,
                                      attn_implementation=attn_implementation, load=_from_pretrained)
        model = _finish(model, device, checkpointing_on(gradient_checkpointing) and train, train)
        if train and freeze_vision_tower:
            freeze_vision(model)
        return model
    model = _from_pretrained(
        AutoModelForSequenceClassification.from_pretrained, path, num_labels=1, dtype=resolve_dtype(dtype, device),
        trust_remote_code=trust_remote_code, attn_implementation=attn_implementation, local_files_only=True)
    return _finish(model, device, checkpointing_on(gradient_checkpointing) and train, train)
