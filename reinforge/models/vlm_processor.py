"""Loading and saving a vision-language processor (image processor + tokenizer + chat template).

transformers 5.24 cannot build a Qwen2-VL processor without torchvision: `AutoProcessor`
instantiates the video processor, which needs torchvision, and `ProcessorMixin.__init__`
type-checks a `video_processor=None` against a class that is only exported with torchvision.
reinforge has no videos, so where torchvision is missing the processor is assembled from its
parts: `AutoImageProcessor` (which picks the Pillow backend) and `AutoTokenizer`, passed to the
processor class the folder names, with the video slot allowed to be empty (`_allow_no_video`).
With torchvision installed `AutoProcessor` is used as is.
"""
from __future__ import annotations

import json
from pathlib import Path

PROCESSOR_FILE = "processor_config.json"


def _allow_no_video() -> None:
    """Let `ProcessorMixin` accept video_processor=None when torchvision is missing (its class
    check looks `VideoProcessorMixin` up on the transformers module, where only a torchvision
    install exports it)."""
    from transformers import processing_utils as pu

    if not hasattr(pu.transformers_module, "VideoProcessorMixin"):
        from transformers.video_processing_utils import VideoProcessorMixin

        pu.transformers_module.VideoProcessorMixin = (VideoProcessorMixin, type(None))


def _has_torchvision() -> bool:
    from transformers.utils import is_torchvision_available

    return is_torchvision_available()


def processor_class(name: str = "Qwen2VLProcessor"):
    import transformers

    _allow_no_video()
    return getattr(transformers, name)


def load_processor(folder: str):
    """The processor of model folder `folder` (AutoProcessor with torchvision, else assembled
    from the folder's image processor and tokenizer, see module docstring)."""
    if _has_torchvision():
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(folder)
    from transformers import AutoImageProcessor, AutoTokenizer

    cfg_file = Path(folder) / PROCESSOR_FILE
    name = json.loads(cfg_file.read_text()).get("processor_class", "Qwen2VLProcessor") if cfg_file.is_file() \
        else "Qwen2VLProcessor"
    tok = AutoTokenizer.from_pretrained(folder)
    return processor_class(name)(image_processor=AutoImageProcessor.from_pretrained(folder), tokenizer=tok,
                                 chat_template=folder_chat_template(folder) or tok.chat_template)


def folder_chat_template(folder: str) -> str | None:
    """The processor-level chat template of a folder (released Qwen2-VL folders keep the one
    that knows image parts in chat_template.json; newer saves write chat_template.jinja), or None."""
    f = Path(folder)
    if (f / "chat_template.json").is_file():
        return json.loads((f / "chat_template.json").read_text()).get("chat_template")
    if (f / "chat_template.jinja").is_file():
        return (f / "chat_template.jinja").read_text()
    return None


def save_processor(processor, out_dir: str) -> None:
    """Write `processor`'s tokenizer (with its chat template), image processor and a
    processor_config.json naming its class (ProcessorMixin.save_pretrained fails on an empty
    video slot)."""
    processor.tokenizer.save_pretrained(out_dir)
    processor.image_processor.save_pretrained(out_dir)
    (Path(out_dir) / PROCESSOR_FILE).write_text(json.dumps({"processor_class": type(processor).__name__}, indent=2))


def is_vlm_folder(folder: str) -> bool:
    """True when the folder's config.json describes an image-text-to-text model (a
    `vision_config` beside the text one), the way loading and checks tell a VLM from a causal LM."""
    cfg = Path(folder) / "config.json"
    if not cfg.is_file():
        return False
    return "vision_config" in json.loads(cfg.read_text())
