"""The tiny Qwen2 taught `12:` -> `<rev>12</rev><r>21</r>21<eos>` by 250 Adam steps on whole
sequences (seconds), so that its episodes call the `rev` tool: the fixture model of
tests/agents/test_agent_e2e.py and (with head sizes vLLM's CPU attention takes) tests/vllm_real."""
from __future__ import annotations

import torch

NUMBERS = [f"{a}{b}" for a in range(1, 10) for b in range(10) if a != b][:24]


def train_tool_model(out: str, *, num_heads: int, num_kv_heads: int) -> str:
    """Write the taught model to `out` (hidden 64, 2 layers, `num_heads` / `num_kv_heads`)."""
    from reinforge.models.loading import load_causal_lm
    from reinforge.models.tiny import make_tiny_model
    from reinforge.tasks import build_char_tokenizer
    from reinforge.tasks.tags import format_tag_call, format_tag_result

    tok = build_char_tokenizer()
    make_tiny_model(tok, out, seed=0, hidden_size=64, num_layers=2, num_heads=num_heads, num_kv_heads=num_kv_heads,
                    intermediate_size=128)
    model = load_causal_lm(out, dtype="float32", device="cpu")
    texts = [f"{x}:" + format_tag_call("rev", x) + format_tag_result(x[::-1]) + x[::-1] for x in NUMBERS]
    ids = torch.as_tensor([tok(t)["input_ids"] + [tok.eos_token_id] for t in texts])
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    for _ in range(250):
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(out)
    return out
