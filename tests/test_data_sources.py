"""Data files that are `datasets` datasets (reinforge.data.hf_datasets): save_to_disk folders
(Dataset, DatasetDict + split) and Hub datasets (hf://datasets/...) read offline from a local
datasets cache, through the same schema checks and messages as parquet/JSONL."""
from __future__ import annotations

import subprocess
import sys

import pytest

from reinforge.data import DataError, RLDataset, SFTDataset, load_rows
from reinforge.data.hf_datasets import parse_hf_spec, source_name

datasets = pytest.importorskip("datasets")

TRAIN = [{"prompt": "1+1=", "ground_truth": "2"}, {"prompt": "2+3=", "ground_truth": "5"}]
TEST = [{"prompt": "4+4=", "ground_truth": "8"}]


@pytest.fixture(scope="module")
def tok():
    from reinforge.tasks import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A DatasetDict (train, test) and a single Dataset, each written with save_to_disk."""
    root = tmp_path_factory.mktemp("saved")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(TRAIN),
                          "test": datasets.Dataset.from_list(TEST)}).save_to_disk(str(root / "arith"))
    datasets.Dataset.from_list(TRAIN).save_to_disk(str(root / "single"))
    return root


def test_save_to_disk_folders(saved, tok):
    assert load_rows(str(saved / "single")) == TRAIN
    assert load_rows(f"{saved / 'arith'}:test") == TEST
    assert load_rows(str(saved / "arith" / "train")) == TRAIN  # a DatasetDict's split folder is a Dataset
    ds = RLDataset(f"{saved / 'arith'}:train", tok, max_prompt_length=8)
    assert [it["ground_truth"] for it in ds] == ["2", "5"] and ds[0]["data_source"] == "arith"
    assert ds[1]["prompt_ids"] == tok("2+3=")["input_ids"]


def test_split_errors_list_the_splits(saved):
    with pytest.raises(DataError, match=r"arith:tset: no split 'tset'; splits: train, test \(name one with :SPLIT\)"):
        load_rows(f"{saved / 'arith'}:tset")
    with pytest.raises(DataError, match=r"arith: more than one split; splits: train, test"):
        load_rows(str(saved / "arith"))


def test_same_schema_errors_as_files(saved, tok):
    """An RL dataset given to SFT fails as the parquet file does: the missing column, named."""
    with pytest.raises(DataError, match=r"^single: no column 'response' \(columns: ground_truth, prompt\)"):
        SFTDataset(str(saved / "single"), tok, max_length=16)


def test_parse_hf_spec():
    assert parse_hf_spec("hf://datasets/openai/gsm8k:main:train") == ("openai/gsm8k", None, "main", "train")
    assert parse_hf_spec("hf://datasets/trl-lib/tldr@v1.0:test") == ("trl-lib/tldr", "v1.0", None, "test")
    assert parse_hf_spec("hf://datasets/org/name") == ("org/name", None, None, None)
    assert source_name("hf://datasets/openai/gsm8k:main:train") == "openai/gsm8k"
    for bad in ("hf://datasets/gsm8k", "hf://datasets/org/name:a:b:c", "hf://datasets/org/name@"):
        with pytest.raises(DataError, match="not a Hub dataset path; write hf://datasets/ORG/NAME"):
            parse_hf_spec(bad)


def test_sft_trains_on_a_saved_dataset(tiny_model_dir, tmp_path):
    """data.train_files=[folder]: the config check accepts the folder and the trainer reads it."""
    from reinforge.config.load import load_config
    from reinforge.config.sft import SFTConfig
    from reinforge.trainers.sft import SFTTrainer

    rows = [{"prompt": f"{a}+1=", "completion": str(a + 1)} for a in range(8)]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "sft"))
    over = {"model.path": tiny_model_dir, "data.train_files": f"[{tmp_path / 'sft'}]", "data.max_length": 16,
            "data.batch_size": 4, "trainer.total_steps": 1, "trainer.run_dir": str(tmp_path / "run"),
            "trainer.loggers": "[jsonl]", "trainer.progress": False}
    trainer = SFTTrainer(load_config(SFTConfig, "sft", [f"{k}={v}" for k, v in over.items()]))
    assert len(trainer.train_rows) == 8
    trainer.fit()


# A Hub dataset as the datasets library caches it (<cache>/org___name/<config>/<version>/<hash>/
# name-<split>.arrow + dataset_info.json): prepared from a local folder called `name`, then moved
# under the org. Read in a fresh interpreter with HF_HUB_OFFLINE=1 and HF_DATASETS_CACHE set.
READ = """
import sys
from reinforge.data import DataError, load_rows
for spec in sys.argv[1:]:
    try:
        print(load_rows(spec))
    except DataError as exc:
        print(exc)
"""


def test_hub_dataset_from_the_cache_offline(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "name" / "data").mkdir(parents=True)
    for split, rows in (("train", TRAIN), ("test", TEST)):
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "name" / "data" / f"{split}-00000-of-00001.parquet")
    monkeypatch.chdir(tmp_path)
    datasets.load_dataset("name", cache_dir=str(tmp_path / "cache"))
    (tmp_path / "cache" / "name").rename(tmp_path / "cache" / "org___name")
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "home"),
           "PATH": "/usr/bin:/bin"}
    specs = ["hf://datasets/org/name:test", "hf://datasets/org/name:tset", "hf://datasets/org/absent:train"]
    out = subprocess.run([sys.executable, "-c", READ, *specs], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    found, bad_split, absent = out.stdout.strip().splitlines()
    assert found == repr(TEST)
    assert bad_split == "hf://datasets/org/name:tset: no split 'tset'; splits: train, test (name one with :SPLIT)"
    assert absent.startswith(f"hf://datasets/org/absent:train: not in the datasets cache ({tmp_path / 'cache'}) "
                             "and the Hub cannot be reached (HF_HUB_OFFLINE=1 or no network)"), absent
