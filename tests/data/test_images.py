"""Image rows: veRL's and TRL's schemas -> the canonical (messages, PIL RGB images), from every
source, and the row errors (reinforge.data.images)."""
import io
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from reinforge.data import DataError, load_rows, write_rows
from reinforge.data.images import base_dir, canonical_messages, drop_images, image_prompt
from tests.data.conftest import write_jsonl

BUDGET = 10_000
# A 2x1 picture with known pixels: red then blue; saved as a palette PNG, so decoding must convert.
PIXELS = [(255, 0, 0), (0, 0, 255)]


def picture(mode: str = "P") -> Image.Image:
    image = Image.new("RGB", (2, 1))
    image.putdata(PIXELS)
    return image.convert(mode) if mode != "RGB" else image


def pixels(image: Image.Image) -> list:
    return [image.getpixel((x, y)) for y in range(image.height) for x in range(image.width)]


def png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def parse(row: dict, path: str = "/data/train.parquet", key: str = "prompt", budget: int = BUDGET):
    return image_prompt(row, path, 0, key, root=base_dir(path), max_pixels=budget)


def test_verl_placeholders_become_parts_in_order():
    row = {"prompt": [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Compare <image> with <image>?"}],
           "images": [{"bytes": png(picture()), "path": None}, {"bytes": png(picture("RGBA")), "path": None}]}
    messages, images = parse(row)
    assert messages == [{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": [{"type": "text", "text": "Compare "}, {"type": "image"},
                                                     {"type": "text", "text": " with "}, {"type": "image"},
                                                     {"type": "text", "text": "?"}]}]
    assert [im.mode for im in images] == ["RGB", "RGB"]
    assert [pixels(im) for im in images] == [PIXELS, PIXELS]


def test_trl_image_parts_and_the_single_image_column():
    prompt = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}]
    messages, images = parse({"prompt": prompt, "image": picture("RGB")})
    assert messages == prompt and pixels(images[0]) == PIXELS
    # no placeholder: the images go in front of the first user message (TRL's convention)
    messages, images = parse({"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "Colour?"}],
                              "images": [png(picture())]})
    assert messages[1] == {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}
    assert parse({"prompt": "Colour?", "image": png(picture())})[0] == messages[1:]
    assert parse({"prompt": "2+2=", "ground_truth": "4"}) is None  # a text row
    assert drop_images(messages) == [{"role": "system", "content": "S"}, {"role": "user", "content": "Colour?"}]


def _rows(image_value) -> list[dict]:
    return [{"prompt": [{"role": "user", "content": "<image>Colour?"}], "images": [image_value],
             "reward_model": {"style": "rule", "ground_truth": "red"}}]


def _decoded(path: str) -> list:
    rows = load_rows(path)
    messages, images = image_prompt(rows[0], path, 0, "prompt", root=base_dir(path), max_pixels=BUDGET)
    assert messages == [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]}]
    return pixels(images[0])


def test_parquet_jsonl_and_save_to_disk(tmp_path):
    import datasets

    assert _decoded(write_rows(_rows({"bytes": png(picture()), "path": None}), str(tmp_path / "a.parquet"))) == PIXELS
    # JSONL holds paths; a relative one resolves against the file's folder, not the working directory
    (tmp_path / "img").mkdir()
    picture().save(tmp_path / "img" / "p.png")
    assert _decoded(write_jsonl(tmp_path / "b.jsonl", _rows("img/p.png"))) == PIXELS
    assert _decoded(write_jsonl(tmp_path / "c.jsonl", _rows({"bytes": None, "path": str(tmp_path / "img/p.png")}))) \
        == PIXELS
    # a save_to_disk folder with datasets' Image feature (stored as {"bytes", "path"})
    features = datasets.Features({"prompt": [{"role": datasets.Value("string"), "content": datasets.Value("string")}],
                                  "images": datasets.List(datasets.Image())})
    ds = datasets.Dataset.from_list([{"prompt": _rows(None)[0]["prompt"], "images": [picture()]}], features=features)
    ds.save_to_disk(str(tmp_path / "saved"))
    assert _decoded(str(tmp_path / "saved")) == PIXELS


HUB_READ = """
import sys
from reinforge.data import load_rows
from reinforge.data.images import base_dir, image_prompt
spec = sys.argv[1]
messages, images = image_prompt(load_rows(spec)[0], spec, 0, "prompt", root=base_dir(spec), max_pixels=100)
print(messages, [images[0].getpixel((x, 0)) for x in range(2)])
"""


def test_hub_dataset_with_images_offline(tmp_path, monkeypatch):
    """veRL's parquet layout as a Hub dataset read from a local datasets cache (as
    tests/test_data_sources.py builds one), offline."""
    import datasets

    (tmp_path / "name" / "data").mkdir(parents=True)
    write_rows(_rows({"bytes": png(picture()), "path": None}), str(tmp_path / "name/data/train-00000-of-00001.parquet"))
    monkeypatch.chdir(tmp_path)
    datasets.load_dataset("name", cache_dir=str(tmp_path / "cache"))
    (tmp_path / "cache" / "name").rename(tmp_path / "cache" / "org___name")
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "home"),
           "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # this checkout
    out = subprocess.run([sys.executable, "-c", HUB_READ, "hf://datasets/org/name:train"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ("[{'role': 'user', 'content': [{'type': 'image'}, {'type': 'text', 'text': "
                                  "'Colour?'}]}] [(255, 0, 0), (0, 0, 255)]")


@pytest.mark.parametrize("row,message", [
    ({"prompt": "<image>x", "images": [{"bytes": b"not a picture", "path": None}]},
     "train.parquet: row 0: field 'images[0]': unreadable image (UnidentifiedImageError"),
    ({"prompt": "<image>x", "images": [png(picture())[:40]]}, "field 'images[0]': unreadable image"),
    ({"prompt": "<image>x", "images": ["missing.png"]}, "field 'images[0]': image file /data/missing.png not found"),
    ({"prompt": "<image>x", "images": [{"bytes": None, "path": None}]},
     "field 'images[0]': neither 'bytes' nor 'path' is set"),
    ({"prompt": "<image>x", "image": 7}, "field 'image': expected image bytes, a path or a {'bytes', 'path'} dict"),
    ({"prompt": "<image><image>x", "images": [png(picture())]},
     "row 0: field 'prompt': the prompt has 2 image placeholder(s) ('<image>' or {'type': 'image'}) but the row "
     "has 1 image(s)"),
    ({"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "image"}]}], "images": [png(picture())]},
     "field 'prompt': the prompt has 2 image placeholder(s)"),
    ({"prompt": "<image>x", "images": None, "other": 1}, "field 'prompt': the prompt has image placeholders but "),
    ({"prompt": "<image>x", "images": []}, "field 'images': empty list of images"),
    ({"prompt": "<image>x", "images": [png(picture()), png(Image.new("RGB", (101, 100)))]},
     "field 'images[1]': image is 101x100 = 10100 pixels > data.max_pixels=10000 (shrink the images"),
    # the budget is checked from the header, before any pixel is decoded (this one is truncated)
    ({"prompt": "<image>x", "images": [png(Image.new("RGB", (200, 200)))[:60]]},
     "field 'images[0]': image is 200x200 = 40000 pixels > data.max_pixels=10000"),
])
def test_row_errors_name_file_row_and_field(row, message):
    with pytest.raises(DataError) as err:
        parse(row)
    assert message in str(err.value), str(err.value)


def test_hub_relative_path_refused():
    with pytest.raises(DataError, match="relative path 'a.png' in a Hub dataset"):
        parse({"prompt": "<image>x", "images": ["a.png"]}, path="hf://datasets/org/name:train")
    with pytest.raises(DataError, match="message 0: content part"):
        canonical_messages([{"role": "user", "content": [{"type": "audio"}]}], 0, "f.jsonl", 3, "prompt")
