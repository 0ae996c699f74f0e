"""LoRA adapters on the actor via PEFT.

Only the adapter matrices train; the base weights stay frozen, so the reference policy is the
same module with the adapter switched off (`ReferenceWorker` uses `disable_adapter()`), and the
HF export merges the adapter into the base weights (`save_merged`).
"""
from __future__ import annotations

import sys


def language_model_targets(model, target_modules: list[str]) -> list[str] | None:
    """A VLM's LoRA targets: the full names of the linear layers of its language model whose
    last name is in `target_modules` (any linear layer for ["all-linear"]), so no adapter lands
    in the vision tower or its merger (whose q/k/v is one `qkv` and would escape a name list,
    but not "all-linear"). None for a model without a `language_model` (a plain causal LM)."""
    import torch

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    lm = getattr(getattr(inner, "model", None), "language_model", None)
    if lm is None:
        return None
    prefix = next(n for n, m in inner.named_modules() if m is lm)
    every = target_modules == ["all-linear"]
    return [f"{prefix}.{n}" for n, m in lm.named_modules()
            if isinstance(m, torch.nn.Linear) and (every or n.rsplit(".", 1)[-1] in target_modules)]


def apply_lora(model, rank: int, alpha: float, target_modules: list[str]):
    """Wrap a causal LM with a fresh LoRA adapter. B starts at zero (PEFT's default), so the
    wrapped model computes exactly the base model until the first update. A VLM's adapters go
    on its language model only (`language_model_targets`)."""
    from peft import LoraConfig, get_peft_model

    targets = target_modules[0] if target_modules == ["all-linear"] else list(target_modules)
    lm_targets = language_model_targets(model, list(target_modules))
    if lm_targets is not None:
        if not lm_targets:
            raise ValueError(f"model.lora_target_modules={list(target_modules)} match no linear layer of the "
                             "language model")
        targets = lm_targets
    cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none",
                     task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, cfg)
    if _checkpointing(model):
        peft_model.enable_input_require_grads()  # frozen embeddings would otherwise cut the grad path
    return peft_model


def with_lora(model, m):
    """`model` wrapped with a fresh LoRA adapter when model.lora_rank > 0 (`m`: the model config
    section: lora_rank, lora_alpha, lora_target_modules), else `model` as it is: what the actor,
    SFT and DPO all load."""
    if m.lora_rank <= 0:
        return model
    return apply_lora(model, m.lora_rank, m.lora_alpha, list(m.lora_target_modules))


def _checkpointing(model) -> bool:
    """Whether activation checkpointing is on in any submodule. Read from the modules' own flag
    (what transformers sets) rather than `is_gradient_checkpointing`, deprecated in 5.x and
    renamed `is_activation_checkpointing` there, so both older and newer versions agree."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def adapter_parameter_names(model) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]


def is_peft(model) -> bool:
    """Whether `model` is wrapped by PEFT. A PEFT model exists only once peft was imported, so
    this never imports it (peft is optional, and its import costs seconds)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def save_merged(model, folder) -> None:
    """`save_pretrained(folder)` of `model`, a PEFT model's adapter merged into a copy of its
    base weights first (the model itself keeps training with the adapter)."""
    if is_peft(model):
        import copy

        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(folder)
