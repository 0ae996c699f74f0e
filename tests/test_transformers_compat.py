"""API differences between the transformers versions reinforge runs on (5.17, the GPU machine's,
and 5.24), handled by feature checks: the lean loop hands its KV cache to a decoder layer under
the keyword the layer's forward declares (`cache` in 5.24, `past_key_values` in 5.17)."""
from __future__ import annotations

import pytest

from reinforge.workers.rollout.lean import cache_keyword


def test_cache_keyword_follows_the_signature():
    class New:
        def forward(self, h, attention_mask=None, cache=None, **kw): ...

    class Old:
        def forward(self, h, attention_mask=None, past_key_values=None, **kw): ...

    class Older:
        def forward(self, h, attention_mask=None, past_key_value=None, **kw): ...

    class Unknown:
        def forward(self, h, **kw): ...

    assert [cache_keyword(c) for c in (New, Old, Older)] == ["cache", "past_key_values", "past_key_value"]
    with pytest.raises(TypeError, match="rollout.backend=hf"):
        cache_keyword(Unknown)


def test_installed_decoder_layers_take_a_known_keyword():
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

    for layer in (Qwen2DecoderLayer, LlamaDecoderLayer):
        assert cache_keyword(layer) in ("cache", "past_key_values")
