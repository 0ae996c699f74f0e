import pytest
import torch

from reinforge.protocol import Batch


def make(n=4):
    return Batch({"x": torch.arange(n), "y": torch.arange(2 * n).view(n, 2)}, {"s": [f"s{i}" for i in range(n)]},
                 {"temperature": 0.7})


def test_union_select_pop():
    b = make()
    c = b | Batch({"z": torch.ones(4)})
    assert set(c.keys()) == {"x", "y", "s", "z"} and c.meta["temperature"] == 0.7
    with pytest.raises(ValueError, match="differs"):
        b | Batch({"x": torch.zeros(4, dtype=torch.long)})
    popped = c.pop(["z", "s"])
    assert set(popped.keys()) == {"z", "s"} and set(c.keys()) == {"x", "y"}
    with pytest.raises(KeyError):
        c.select(["nope"])


def test_split_chunk_concat_roundtrip():
    b = make(5)
    parts = b.split(2)
    assert [len(p) for p in parts] == [2, 2, 1]
    assert [len(p) for p in b.chunk(2)] == [3, 2]
    back = Batch.concat(parts)
    assert torch.equal(back["y"], b["y"]) and back["s"] == b["s"]


def test_repeat_is_interleaved_and_index():
    b = make(2).repeat(3)
    assert b["x"].tolist() == [0, 0, 0, 1, 1, 1]
    assert b["s"] == ["s0", "s0", "s0", "s1", "s1", "s1"]
    sub = b[torch.tensor([5, 0])]
    assert sub["x"].tolist() == [1, 0] and sub["s"] == ["s1", "s0"]
    assert len(b[1:3]) == 2


def test_mismatched_sizes_rejected():
    with pytest.raises(ValueError, match="batch size"):
        Batch({"a": torch.zeros(3)}, {"b": [1, 2]})
