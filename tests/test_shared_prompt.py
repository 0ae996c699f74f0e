"""models/shared_prompt.py: each distinct prompt forwarded once, the responses on its cache, equals
the whole rows (log-probs, entropies, every gradient) on left-padded prompts of several lengths."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2ForCausalLM

from reinforge.models import shared_prompt
from reinforge.models.forward import response_logprobs
from reinforge.models.shared_prompt import distinct_prompts
from reinforge.models.tiny import tiny_qwen2_config

V, P, T = 97, 7, 5


def _qwen2():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(tiny_qwen2_config(V, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                              intermediate_size=96))


def _llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False,
                                        max_position_embeddings=64))


def grouped_batch(n: int = 3, lens=(7, 3, 5), seed: int = 0):
    """len(lens) prompts of those lengths (left-padded to P), each with n responses of varied
    lengths (right-padded to T): rows of one prompt adjacent, except the last two swapped."""
    g = torch.Generator().manual_seed(seed)
    rows, masks = [], []
    for k, plen in enumerate(lens):
        prompt = torch.randint(3, V, (plen,), generator=g)
        for j in range(n):
            rlen = 1 + (k + 2 * j) % T
            ids, mask = torch.zeros(P + T, dtype=torch.long), torch.zeros(P + T, dtype=torch.long)
            ids[P - plen:P], mask[P - plen:P + rlen] = prompt, 1
            ids[P:P + rlen] = torch.randint(3, V, (rlen,), generator=g)
            rows.append(ids)
            masks.append(mask)
    ids, mask = torch.stack(rows), torch.stack(masks)
    order = list(range(len(rows)))
    order[-1], order[-2] = order[-2], order[-1]
    return ids[order], mask[order]


def test_distinct_prompts_first_rows_in_order_of_appearance():
    ids = torch.tensor([[0, 5, 6], [1, 2, 3], [0, 5, 6], [0, 5, 6], [1, 2, 3], [0, 0, 6]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1], [0, 1, 1], [0, 1, 1], [1, 1, 1], [0, 0, 1]])
    first, inv = distinct_prompts(ids, mask)
    assert first.tolist() == [0, 1, 5] and inv.tolist() == [0, 1, 0, 0, 1, 2]
    # same ids, different mask: different prompts
    first, inv = distinct_prompts(torch.zeros(2, 3, dtype=torch.long), torch.tensor([[0, 1, 1], [1, 1, 1]]))
    assert first.tolist() == [0, 1] and inv.tolist() == [0, 1]


@pytest.mark.parametrize("make", [_qwen2, _llama], ids=["qwen2", "llama"])
def test_shared_prompt_equals_whole_rows(make, monkeypatch):
    model = make().train()
    ids, mask = grouped_batch()
    weight = torch.randn(ids.shape[0], T, generator=torch.Generator().manual_seed(1))
    calls = []
    real = shared_prompt._plain_cache
    monkeypatch.setattr(shared_prompt, "_plain_cache", lambda c: calls.append(1) or real(c))

    def run(share: bool):
        model.zero_grad()
        lp, ent = response_logprobs(model, ids, mask, T, with_entropy=True, share_prompt=share, temperature=0.7)
        resp = mask[:, -T:].float()
        ((lp * weight * resp).sum() + 0.1 * (ent * resp).sum()).backward()
        return lp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    lp0, ent0, g0 = run(False)
    assert not calls
    lp1, ent1, g1 = run(True)
    assert calls == [1]  # the shared path ran (9 rows, 3 prompts)
    resp = mask[:, -T:].bool()
    torch.testing.assert_close(lp1[resp], lp0[resp], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent1[resp], ent0[resp], atol=1e-5, rtol=0)
    for name, g in g0.items():
        scale = g.norm().clamp(min=1e-8)
        assert (g1[name] - g).norm() / scale < 1e-5, name


def test_shared_prompt_falls_back_to_whole_rows(monkeypatch):
    """Every prompt distinct, or activation checkpointing in a backward: the whole rows run."""
    model = _qwen2().train()
    ids, mask = grouped_batch(n=1)
    calls = []
    monkeypatch.setattr(shared_prompt, "_plain_cache", lambda c: calls.append(1) or True)
    lp_whole, _ = response_logprobs(model, ids, mask, T)
    lp, _ = response_logprobs(model, ids, mask, T, share_prompt=True)
    assert not calls and torch.equal(lp, lp_whole)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids, mask = grouped_batch(n=3)
    lp, _ = response_logprobs(model, ids, mask, T, share_prompt=True)
    assert not calls
    lp.sum().backward()


def test_sliding_window_cache_runs_whole_rows():
    """A model whose cache drops old keys (sliding window layers) is not shared: checked on the
    prompt forward's cache, the result is the whole rows'."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, sliding_window=4,
                                             max_position_embeddings=64)).eval()
    ids, mask = grouped_batch()
    with torch.no_grad():
        lp0, _ = response_logprobs(model, ids, mask, T)
        lp1, _ = response_logprobs(model, ids, mask, T, share_prompt=True)
    resp = mask[:, -T:].bool()
    torch.testing.assert_close(lp1[resp], lp0[resp], atol=1e-5, rtol=0)


@pytest.mark.parametrize("other_rank_shares", [True, False])
def test_ranks_agree_on_sharing(monkeypatch, other_rank_shares):
    """Under a process group every rank must take the same path (FSDP ranks run the same forwards):
    this rank repeats its prompts; it shares only when the other rank's micro-batch does too."""
    import torch.distributed as dist

    def all_reduce(t, op=None):  # the other rank's vote: 0 = it shares, 1 = it runs whole rows
        t += 0 if other_rank_shares else 1

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    model = _qwen2().eval()
    ids, mask = grouped_batch(n=3)
    calls = []
    monkeypatch.setattr(shared_prompt, "_plain_cache", lambda c: calls.append(1) or True)
    lp_whole, _ = response_logprobs(model, ids, mask, T)
    lp, _ = response_logprobs(model, ids, mask, T, share_prompt=True)
    assert bool(calls) == other_rank_shares
    torch.testing.assert_close(lp, lp_whole, atol=1e-5, rtol=0)
