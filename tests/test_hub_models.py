"""Hub ids as model paths (reinforge.models.hub), without network: a fake Hugging Face cache
(models--org--name/snapshots/<sha>/ + refs/main, the layout huggingface_hub writes) under tmp,
read with HF_HUB_OFFLINE=1."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reinforge.config.load import ConfigError
from reinforge.models.hub import resolve_model_path, split_hub_id

SHA = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, tiny_model_dir) -> Path:
    """A cache holding the tiny model as `org/tiny` (main = SHA)."""
    cache = tmp_path_factory.mktemp("hf_cache")
    repo = cache / "models--org--tiny"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / SHA)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(SHA)
    return cache


@pytest.fixture
def offline(monkeypatch, hub_cache):
    """huggingface_hub reads HF_HUB_OFFLINE / HF_HUB_CACHE at import: patch its constants too."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    return hub_cache


def test_split_hub_id():
    assert split_hub_id("Qwen/Qwen2.5-0.5B-Instruct") == ("Qwen/Qwen2.5-0.5B-Instruct", None)
    assert split_hub_id("org/name@v1.0") == ("org/name", "v1.0")
    assert split_hub_id(f"org/name@{SHA}") == ("org/name", SHA)
    assert split_hub_id("org/name@refs/pr/3") == ("org/name", "refs/pr/3")
    for not_an_id in ("runs/sft/hf", "/abs/folder", "./org/name", "model", "", "org/", "org/name@"):
        assert split_hub_id(not_an_id) is None, not_an_id


def test_resolves_from_the_cache_offline(offline):
    snapshot = str(offline / "models--org--tiny" / "snapshots" / SHA)
    assert resolve_model_path("org/tiny", "model.path") == snapshot
    assert resolve_model_path(f"org/tiny@{SHA}", "model.path") == snapshot


def test_existing_local_folder_wins(offline, tmp_path, monkeypatch):
    (tmp_path / "org" / "tiny").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("org/tiny", "model.path") == "org/tiny"


def test_missing_id_offline_is_one_line_error(offline):
    with pytest.raises(ConfigError) as err:
        resolve_model_path("org/absent@v2", "critic.model_path")
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("critic.model_path='org/absent@v2': no such folder, and Hub model 'org/absent' at "
                          "revision 'v2' is not in the Hugging Face cache")
    assert "HF_HUB_OFFLINE=1" in msg and "hf download org/absent" in msg


def test_sft_trains_from_a_hub_id(offline, arith_data, tmp_path):
    """model.path=org/tiny: preflight resolves it, the trainer loads it, config.yaml records both."""
    import yaml

    from reinforge.config.load import load_config
    from reinforge.config.sft import SFTConfig
    from reinforge.trainers.sft import SFTTrainer

    over = {"model.path": "org/tiny", "data.train_files": f"[{arith_data['sft']}]", "data.max_length": 16,
            "data.batch_size": 4, "trainer.total_steps": 1, "trainer.run_dir": str(tmp_path / "run"),
            "trainer.loggers": "[jsonl]", "trainer.progress": False}
    cfg = load_config(SFTConfig, "sft", [f"{k}={v}" for k, v in over.items()])
    trainer = SFTTrainer(cfg)
    assert trainer.cfg.model.path == str(offline / "models--org--tiny" / "snapshots" / SHA)
    trainer.fit()
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["derived"]["hub_ids"] == {"model.path": "org/tiny"}


def test_eval_takes_a_hub_id(offline, arith_data, capsys):
    """`reinforge eval --model org/tiny` resolves the id like model.path; a missing one is the
    same one-line error, before anything loads."""
    import json

    from reinforge.cli.main import main

    argv = ["eval", "--model", "org/tiny", "--data", arith_data["test"], "--reward", "arithmetic",
            "--max-samples", "2", "--n", "2", "--max-prompt-length", "8", "--max-response-length", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    metrics = json.loads(out[out.index("{"):])
    assert 0.0 <= metrics["val/acc_greedy"] <= 1.0
    assert main(["eval", "--model", "org/absent", "--data", arith_data["test"]]) == 2
    assert "--model='org/absent': no such folder, and Hub model 'org/absent'" in capsys.readouterr().err


RESOLVE = """
import sys
from reinforge.config.load import ConfigError
from reinforge.models.hub import resolve_model_path
for spec in sys.argv[1:]:
    try:
        print(resolve_model_path(spec, "model.path"))
    except ConfigError as exc:
        print(exc)
"""


def test_environment_variables_honoured(hub_cache, tmp_path):
    """HF_HUB_OFFLINE=1 and HF_HUB_CACHE set in the environment of a fresh interpreter (as a user
    sets them for the CLI) are what the resolver reads: no monkeypatching."""
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub_cache), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", RESOLVE, "org/tiny", "org/absent"], capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    found, missing = out.stdout.strip().splitlines()
    assert found == str(hub_cache / "models--org--tiny" / "snapshots" / SHA)
    assert missing.startswith("model.path='org/absent': no such folder, and Hub model 'org/absent' is not in the "
                              f"Hugging Face cache ({hub_cache}) and HF_HUB_OFFLINE=1"), missing


def _online(monkeypatch, hub_cache, model_info):
    """Online mode with HfApi.model_info replaced (no network here) and snapshot_download
    recording its arguments."""
    import huggingface_hub
    from huggingface_hub import constants

    calls = []
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    real = huggingface_hub.snapshot_download

    def record(repo, **kwargs):
        if kwargs.get("local_files_only"):
            return real(repo, **kwargs)
        calls.append((repo, kwargs))
        return "/downloaded"

    monkeypatch.setattr(huggingface_hub, "snapshot_download", record)
    return calls


@pytest.mark.parametrize("files,pickled_ignored", [
    (["config.json", "model.safetensors", "pytorch_model.bin", "tf_model.h5"], True),
    (["config.json", "pytorch_model.bin"], False),
])
def test_online_downloads_only_what_torch_reads(monkeypatch, hub_cache, files, pickled_ignored):
    from types import SimpleNamespace

    info = SimpleNamespace(siblings=[SimpleNamespace(rfilename=f) for f in files])
    calls = _online(monkeypatch, hub_cache, lambda self, repo, revision=None: info)
    assert resolve_model_path("org/other@v1", "model.path") == "/downloaded"
    [(repo, kwargs)] = calls
    assert repo == "org/other" and kwargs["revision"] == "v1"
    assert "*.h5" in kwargs["ignore_patterns"] and ("*.bin" in kwargs["ignore_patterns"]) == pickled_ignored


def test_no_network_falls_back_to_the_cache(monkeypatch, hub_cache):
    """One failed request (no retry loop), then the cache: found, or one line naming the error."""
    def unreachable(self, repo, revision=None):
        raise ConnectionError("Name or service not known")

    calls = _online(monkeypatch, hub_cache, unreachable)
    assert resolve_model_path("org/tiny", "model.path") == str(hub_cache / "models--org--tiny" / "snapshots" / SHA)
    with pytest.raises(ConfigError, match=r"^model.path='org/absent': no such folder, and Hub model 'org/absent' is not "
                                          r"in the Hugging Face cache and could not be downloaded \(ConnectionError: "
                                          r"Name or service not known\); check the network"):
        resolve_model_path("org/absent", "model.path")
    assert calls == []
