"""The tiny Qwen2-VL (`reinforge model --arch qwen2-vl-tiny`): folder, processor, forward, generate."""
import pytest
import torch
from PIL import Image

from reinforge.models.vlm_processor import is_vlm_folder, load_processor


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from reinforge.cli.main import main

    out = tmp_path_factory.mktemp("vlm") / "m"
    assert main(["model", "--arch", "qwen2-vl-tiny", "--hidden", "64", "--layers", "2", str(out)]) == 0
    return str(out)


def test_folder_loads_with_transformers_classes(folder):
    from transformers import AutoModelForImageTextToText, Qwen2VLForConditionalGeneration, Qwen2VLProcessor

    assert is_vlm_folder(folder)
    proc = load_processor(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder)
    assert isinstance(proc, Qwen2VLProcessor) and isinstance(model, Qwen2VLForConditionalGeneration)
    tok = proc.tokenizer
    assert len(tok) == model.config.text_config.vocab_size < 128  # the small vocabulary
    assert tok.convert_tokens_to_ids("<|image_pad|>") == model.config.image_token_id
    assert tok.pad_token_id == 0 and tok.eos_token == "<|im_end|>" and tok.padding_side == "left"


def test_image_token_expansion_and_pixel_budget(folder):
    proc = load_processor(folder)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    # 56x56: 4x4 patches of 14 -> 2x2 merged = 4 tokens; 30x30 is raised to the 56x56 minimum;
    # 300x300 is lowered under the 112x112 budget (rounded down to 84x84: 6x6 patches -> 9 tokens).
    imgs = [Image.new("RGB", (56, 56), "red"), Image.new("RGB", (30, 30), "blue"), Image.new("RGB", (300, 300))]
    out = proc(text=[text] * 3, images=[[i] for i in imgs], return_tensors="pt", padding=True)
    assert out["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4], [1, 6, 6]]
    n_img = (out["input_ids"] == proc.image_token_id).sum(-1).tolist()
    assert n_img == [4, 4, 9]
    assert (out["mm_token_type_ids"] == 1).sum(-1).tolist() == n_img
    assert out["pixel_values"].shape == (16 + 16 + 36, 3 * 2 * 14 * 14)


def test_forward_and_generate_on_cpu(folder):
    from transformers import AutoModelForImageTextToText

    proc = load_processor(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    out = proc(text=[text], images=[[Image.new("RGB", (56, 56), "green")]], return_tensors="pt")
    with torch.no_grad():
        logits = model(**out).logits
        gen = model.generate(**out, max_new_tokens=3, do_sample=False)
    assert logits.shape == (1, out["input_ids"].shape[1], len(proc.tokenizer)) and torch.isfinite(logits).all()
    assert gen.shape == (1, out["input_ids"].shape[1] + 3)


def test_qwen2_5_vl_tiny_folder(tmp_path):
    from transformers import AutoModelForImageTextToText, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor

    from reinforge.cli.main import main

    out = str(tmp_path / "m")
    assert main(["model", "--arch", "qwen2.5-vl-tiny", "--hidden", "64", "--layers", "2", "--intermediate-size", "96",
                 "--vision-embed-dim", "32", "--min-pixels", "3136", "--max-pixels", "3136", out]) == 0
    assert isinstance(load_processor(out), Qwen2_5_VLProcessor)
    assert load_processor(out).image_processor.size["longest_edge"] == 3136
    assert isinstance(AutoModelForImageTextToText.from_pretrained(out), Qwen2_5_VLForConditionalGeneration)


def test_qwen2_vocabulary_folder(tmp_path, real_vocabs):
    """--vocab qwen2: the released BPE vocabulary, its vision tokens at the released ids."""
    from transformers import AutoModelForImageTextToText

    from reinforge.cli.main import main

    out = str(tmp_path / "m")
    assert main(["model", "--arch", "qwen2-vl-tiny", "--vocab", "qwen2", "--hidden", "32", "--layers", "1", out]) == 0
    proc, model = load_processor(out), AutoModelForImageTextToText.from_pretrained(out)
    assert model.config.image_token_id == proc.image_token_id == 151655
    assert model.config.text_config.vocab_size == 151936
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hello world"}]}]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    out_ = proc(text=[text], images=[[Image.new("RGB", (56, 56))]], return_tensors="pt")
    ids = out_["input_ids"][0].tolist()
    assert ids.count(151655) == 4 and 151652 in ids and 151653 in ids
    with torch.no_grad():
        assert torch.isfinite(model(**out_).logits).all()
