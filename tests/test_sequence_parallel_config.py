"""trainer.sequence_parallel: the rules refused before any model loads, the row masks the Ulysses
attention builds (equal to transformers' own), and the data shards of sequence-parallel groups.
The two-rank equality with one process: tests/distributed/test_sequence_parallel.py."""
from __future__ import annotations

import pytest
import torch

from reinforge.config.load import ConfigError, load_config
from reinforge.config.schema import RLConfig
from reinforge.config.validate import validate
from tests.conftest import rl_overrides

RAY2 = {"trainer.backend": "ray", "trainer.devices_per_node": 2}


@pytest.mark.parametrize("extra,match", [
    ({"trainer.sequence_parallel": 2}, r"trainer.sequence_parallel=2 splits rows over Ray ranks: set trainer.backend=ray"),
    ({**RAY2, "trainer.devices_per_node": 3, "trainer.sequence_parallel": 2},
     r"trainer.sequence_parallel=2 must divide the data-parallel world size .* = 3"),
    # the tiny model has 4 heads and 2 key/value heads
    ({**RAY2, "trainer.devices_per_node": 4, "trainer.sequence_parallel": 4},
     r"model.path=.*trainer.sequence_parallel=4 must divide the attention heads \(4\) and the key/value heads \(2\)"),
    ({**RAY2, "trainer.devices_per_node": 3, "trainer.sequence_parallel": 3}, r"attention heads \(4\)"),
    ({**RAY2, "trainer.sequence_parallel": 2, "model.attn_implementation": "eager"},
     "wraps sdpa attention: set model.attn_implementation=sdpa"),
    ({"trainer.sequence_parallel": 0}, "trainer.sequence_parallel"),
])
def test_refused_before_a_model_loads(tiny_model_dir, arith_data, tmp_path, no_model_loads, extra, match):
    with pytest.raises(ConfigError, match=match):
        validate(load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path), **extra)))


def test_accepted(tiny_model_dir, arith_data, tmp_path, no_model_loads):
    cfg = load_config(RLConfig, "grpo", rl_overrides(tiny_model_dir, arith_data, str(tmp_path),
                                                     **RAY2, **{"trainer.sequence_parallel": 2}))
    assert validate(cfg).trainer.sequence_parallel == 2


def _hf_mask(attention_mask, position_ids):
    """transformers' own sdpa mask of these rows (None: plain causal)."""
    from transformers import Qwen2Config
    from transformers.masking_utils import create_causal_mask

    cfg = Qwen2Config(hidden_size=8, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1)
    cfg._attn_implementation = "sdpa"
    embeds = torch.zeros(*position_ids.shape, 8)
    return create_causal_mask(config=cfg, inputs_embeds=embeds, attention_mask=attention_mask, cache=None,
                              position_ids=position_ids)


def test_full_mask_is_transformers_mask():
    """The mask every rank of a group hands sdpa is the one the single-process forward uses: on
    left/right-padded rows, on packed rows (positions restart), and None for unpadded rows."""
    from reinforge.models.forward import position_ids_from_mask
    from reinforge.models.seq_parallel import full_mask

    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    pos = position_ids_from_mask(mask)
    assert torch.equal(full_mask(mask, pos), _hf_mask(mask, pos))
    packed = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]])
    assert torch.equal(full_mask(None, packed), _hf_mask(None, packed))
    ones = torch.ones(2, 6, dtype=torch.long)
    assert full_mask(ones, position_ids_from_mask(ones)) is None and _hf_mask(ones, position_ids_from_mask(ones)) is None
    assert full_mask(None, torch.arange(6).expand(2, 6)) is None


def test_route_splits_rows_by_owner():
    """The rows a selection picks, split by the rank whose slice holds them (Lc = 4 of 8)."""
    from reinforge.models.seq_parallel import SPGroup, route

    select = lambda x: x[:, 2:7].reshape(-1, x.shape[-1])  # noqa: E731  5 positions of 2 rows
    for rank, (mine, local) in enumerate([([0, 1, 5, 6], [2, 3, 6, 7]), ([2, 3, 4, 7, 8, 9], [0, 1, 2, 4, 5, 6])]):
        r = route(select, 2, 7, 4, SPGroup(None, rank, 2), "cpu")
        assert r.counts == [4, 6] and r.total == 10
        assert r.positions[rank].tolist() == mine and r.local_index.tolist() == local


def test_shards_per_sequence_parallel_group(monkeypatch):
    """4 ranks in groups of 2: ranks 0 and 1 get the same rows, 2 and 3 the other half."""
    from reinforge.models import seq_parallel
    from reinforge.protocol import Batch
    from reinforge.workers import dp

    batch = Batch({"attention_mask": torch.ones(8, 5, dtype=torch.long), "x": torch.arange(8)})
    monkeypatch.setattr(dp, "world_size", lambda: 4)
    shards = []
    for rank in range(4):
        monkeypatch.setattr(dp, "rank", lambda rank=rank: rank)
        monkeypatch.setattr(seq_parallel, "_GROUP", seq_parallel.SPGroup(None, rank % 2, 2))
        shards.append(sorted(dp.shard(batch)["x"].tolist()))
    assert shards[0] == shards[1] and shards[2] == shards[3] and len(shards[0]) == 4
    assert sorted(shards[0] + shards[2]) == list(range(8))
