"""Loading a VLM folder as actor / reference, its processor, the frozen vision tower, LoRA on the
language model only, the folder checks and model.freeze_vision_tower's validation."""
import pytest

from reinforge.config.load import ConfigError
from reinforge.models.loading import load_causal_lm, load_vlm_processor, vision_tower


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from reinforge.models.vlm_tiny import make_tiny_vlm

    out = str(tmp_path_factory.mktemp("vlm") / "m")
    make_tiny_vlm(out, hidden_size=64, num_layers=2)
    return out


def _trainable(model, part):
    return {p.requires_grad for n, p in model.named_parameters() if part in n}


def test_actor_and_reference_load_with_the_vision_tower_frozen(folder):
    from transformers import Qwen2VLForConditionalGeneration

    actor = load_causal_lm(folder, dtype="float32")
    assert isinstance(actor, Qwen2VLForConditionalGeneration) and actor.training
    assert _trainable(actor, "visual") == {False} and _trainable(actor, "language_model") == {True}
    full = load_causal_lm(folder, dtype="float32", freeze_vision_tower=False)
    assert _trainable(full, "visual") == {True}
    ref = load_causal_lm(folder, dtype="float32", train=False)
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    proc = load_vlm_processor(folder)
    assert proc.tokenizer.padding_side == "left" and proc.image_token_id == actor.config.image_token_id


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["all-linear"]])
def test_lora_goes_on_the_language_model_only(folder, targets):
    from reinforge.models.lora import apply_lora

    model = apply_lora(load_causal_lm(folder, dtype="float32"), 4, 8.0, targets)
    lora = [n for n, _ in model.named_parameters() if "lora_" in n]
    assert lora and all("language_model" in n for n in lora)
    assert vision_tower(model) is not None and not any("lora_" in n for n, _ in vision_tower(model).named_parameters())
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable == lora
    # an image prompt's log-probs through the PEFT wrapper: gradients reach the adapters only
    import torch
    from PIL import Image

    from reinforge.models.forward import response_logprobs
    from reinforge.models.vlm_inputs import prompt_batch

    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "n?"}]}]
    b = prompt_batch(load_vlm_processor(folder), [(msgs, [Image.new("RGB", (56, 56), "red")])], 32)
    ids = torch.cat([b["input_ids"], torch.tensor([[40, 41, 2]])], 1)
    mask = torch.cat([b["attention_mask"], torch.ones(1, 3, dtype=torch.long)], 1)
    lp, _ = response_logprobs(model, ids, mask, 3, vision=b["vision"])
    lp.sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert set(grads) <= set(lora) and any(g.abs().sum() > 0 for g in grads.values())


def test_folder_checks_accept_a_vlm_folder(folder):
    from reinforge.models.checks import check_logit_transform, check_model_files, check_tokenizer_files

    check_model_files(folder, "model.path")
    check_tokenizer_files(folder, "model.path")
    check_logit_transform(folder, "model.path")


def test_freeze_vision_tower_validation():
    from reinforge.config.schema import ModelConfig, TrainerConfig
    from reinforge.config.validate import check_model_and_run

    check_model_and_run(ModelConfig(freeze_vision_tower=False), TrainerConfig())
    with pytest.raises(ConfigError, match="model.freeze_vision_tower=false"):
        check_model_and_run(ModelConfig(freeze_vision_tower=False, lora_rank=8), TrainerConfig())
    with pytest.raises(ConfigError, match="model.freeze_vision_tower='yes'"):
        check_model_and_run(ModelConfig(freeze_vision_tower="yes"), TrainerConfig())
