"""Image rows through the datasets with a real Qwen2-VL processor (the tiny VLM's, models/vlm_tiny.py):
the prompt ids the data layer computes are the ones the model side encodes (image tokens
expanded), so data.max_prompt_length counts them; the canonical (messages, images) ride on the items."""
import pytest

from reinforge.data import DataError, PreferenceDataset, RLDataset, SFTDataset, load_rows
from reinforge.tasks import make_task_data
from tests.data.conftest import write_jsonl

vlm_tiny = pytest.importorskip("reinforge.models.vlm_tiny")  # the model side of issue 25 (another branch until merged)


@pytest.fixture(scope="module")
def proc():
    return vlm_tiny.build_vlm_processor(min_pixels=56 * 56, max_pixels=112 * 112)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return make_task_data("count_shapes", str(tmp_path_factory.mktemp("shapes")), n_train=6, n_test=2, n_sft=4, seed=1)


def _image_tokens(proc, ids) -> int:
    return ids.count(proc.tokenizer.convert_tokens_to_ids(vlm_tiny.IMAGE_PAD))


def test_rl_items_match_the_model_side_encoding(proc, files):
    from reinforge.models.vlm_inputs import encode_prompt

    ds = RLDataset(files["train"], proc, max_prompt_length=64)
    assert len(ds) == 6
    for it in ds:
        assert it["prompt_messages"] == [{"role": "user", "content": [{"type": "image"},
                                                                      {"type": "text", "text": "How many red shapes?"}]}]
        assert it["images"][0].size == (56, 56) and "images" not in it["extra"]
        ids, vision = encode_prompt(proc, it["prompt_messages"], it["images"])
        assert it["prompt_ids"] == ids and _image_tokens(proc, ids) == 4  # (56/28)^2 merged patches
        assert it["ground_truth"] in {"1", "2", "3", "4", "5"}
    longest = max(len(it["prompt_ids"]) for it in ds)
    with pytest.raises(DataError, match=f"prompt has {longest} tokens > data.max_prompt_length={longest - 1}"):
        RLDataset(files["train"], proc, max_prompt_length=longest - 1, overlong_prompt="truncate_left")


def test_sft_and_preference_items(proc, files):
    from reinforge.models.vlm_inputs import encode_prompt

    sft = SFTDataset(files["sft"], proc, max_length=64)
    prefs = PreferenceDataset(files["prefs"], proc, max_length=64)
    for it, pair, row in zip(sft, prefs, load_rows(files["sft"])):
        ids, _ = encode_prompt(proc, it["prompt_messages"], it["images"])
        n = len(ids)
        assert it["input_ids"][:n] == ids and it["loss_mask"] == [0] * n + [1] * (len(it["input_ids"]) - n)
        assert proc.tokenizer.decode(it["input_ids"][n:]) == row["response"] + vlm_tiny.IM_END
        assert pair["prompt_ids"] == ids and pair["chosen_ids"] != pair["rejected_ids"]


def test_trl_rows_and_a_text_row_beside_them(proc, tmp_path, files):
    image = load_rows(files["test"])[0]["images"][0]["bytes"]
    (tmp_path / "a.png").write_bytes(image)
    rows = [{"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Count?"}]}],
             "image": "a.png", "answer": "2"},
            {"prompt": [{"role": "user", "content": "No picture."}], "answer": "0"}]
    first, second = RLDataset(write_jsonl(tmp_path / "trl.jsonl", rows), proc, max_prompt_length=64)
    assert _image_tokens(proc, first["prompt_ids"]) == 4 and first["ground_truth"] == "2"
    assert "images" not in second and _image_tokens(proc, second["prompt_ids"]) == 0
