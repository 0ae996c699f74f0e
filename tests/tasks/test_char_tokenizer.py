"""The character-level tokenizer is a real HF tokenizer that survives save/load."""

from transformers import AutoTokenizer

from reinforge.tasks import build_char_tokenizer


def test_char_tokenizer_round_trip(tmp_path):
    tok = build_char_tokenizer(save_dir=str(tmp_path))
    loaded = AutoTokenizer.from_pretrained(str(tmp_path))
    text = "37+45= (3+5)*2 -> 16: Hello, World!"
    for t in (tok, loaded):
        ids = t(text)["input_ids"]
        assert len(ids) == len(text)  # one token per character, no BOS/EOS added
        assert t.decode(ids) == text
        assert t.pad_token == "<pad>" and t.eos_token == "<eos>" and t.padding_side == "left"
        assert t.convert_ids_to_tokens(t.pad_token_id) == "<pad>"
    assert loaded("12<eos>")["input_ids"] == tok("12")["input_ids"] + [tok.eos_token_id]
    assert loaded.decode(tok("12")["input_ids"] + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == "12"
    batch = loaded(["1", "123"], padding=True)
    assert batch["attention_mask"] == [[0, 0, 1], [1, 1, 1]]
    msgs = [{"role": "user", "content": "3+4="}]
    assert loaded.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == "3+4="
    assert tok("é")["input_ids"] == [tok.unk_token_id]
