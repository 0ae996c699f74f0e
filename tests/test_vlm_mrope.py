"""M-RoPE positions and image-prompt log-probs of a VLM batch under left padding and packing
equal the model's own computation on each unpadded sequence, also with the image placeholder id
inside responses (text there: a random policy samples it); the vision encoder runs once per
distinct prompt (a group's n samples share it)."""
import pytest
import torch
from PIL import Image

from reinforge.models.forward import response_logprobs
from reinforge.models.mrope import sequence_mrope
from reinforge.models.packing import pack, packed_response_logprobs, packed_vision
from reinforge.models.vlm_forward import EncoderCounter, image_inputs, vlm_position_ids
from reinforge.models.vlm_inputs import prompt_batch

P, T = 48, 6


def _prompts():
    # Different image sizes (grids 4x4, 6x4 -> 2x2 and 3x2 merged: h != w) and text lengths, one
    # prompt with two images and one without.
    red, wide, tall = Image.new("RGB", (56, 56), "red"), Image.new("RGB", (84, 56), "blue"), Image.new("RGB", (56, 84))
    img = {"type": "image"}
    return [([{"role": "user", "content": [img, {"type": "text", "text": "Count?"}]}], [red]),
            ([{"role": "user", "content": [{"type": "text", "text": "A"}, img, img, {"type": "text", "text": "b"}]}],
             [wide, tall]),
            ([{"role": "user", "content": "text only, longer prompt"}], None)]


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def vlm(request):
    from reinforge.models.vlm_tiny import make_tiny_vlm

    model, proc = make_tiny_vlm(hidden_size=64, num_layers=2, seed=1, family=request.param)
    return model.eval(), proc


def _batch(model, proc, placeholders: bool):
    out = prompt_batch(proc, _prompts(), P)
    g = torch.Generator().manual_seed(0)
    lens = [T, 3, 5]
    resp = torch.randint(10, 100, (3, T), generator=g)
    if placeholders:  # sampled image placeholder ids in responses (row 2: the one without an image)
        resp[0, [1, 4]] = resp[1, 0] = resp[2, 2] = model.config.image_token_id
    rmask = torch.zeros(3, T, dtype=torch.long)
    for i, n in enumerate(lens):
        rmask[i, :n] = 1
    resp = resp * rmask  # pad id 0 after each response
    ids = torch.cat([out["input_ids"], resp], 1)
    mask = torch.cat([out["attention_mask"], rmask], 1)
    return ids, mask, out["vision"]


@pytest.fixture(scope="module")
def batch(vlm):
    return _batch(*vlm, placeholders=False)


@pytest.fixture(scope="module", params=[False, True], ids=["text", "placeholders"])
def batches(vlm, request):
    """The batch, and the same with the image placeholder id sampled inside responses."""
    return _batch(*vlm, placeholders=request.param)


def _prompt_slots(model, seq, v):
    """(1, n) bool: the prompt's placeholders of one unpadded sequence (its first ones)."""
    is_ph = seq == model.config.image_token_id
    n = int(v.image_grid_thw.prod(-1).sum()) // 4 if v is not None else 0
    return is_ph & (is_ph.cumsum(-1) <= n)


def _own_positions(model, ids, mask, vision):
    """The model's get_rope_index on each unpadded sequence on its own (mm_token_type_ids: the
    prompt's placeholders) -> list of (3, n)."""
    out = []
    for b in range(ids.shape[0]):
        seq = ids[b][mask[b].bool()][None]
        grid = vision[b].image_grid_thw if vision[b] is not None else None
        if grid is None:
            out.append(torch.arange(seq.shape[1]).expand(3, -1))
            continue
        pos, _ = model.model.get_rope_index(seq, mm_token_type_ids=_prompt_slots(model, seq, vision[b]).long(),
                                            image_grid_thw=grid)
        out.append(pos[:, 0])
    return out


def test_sequence_mrope_hand_case():
    # text, text, a 1x2x3 image (6 tokens), text: the image costs max(2, 3) = 3 positions.
    flags = torch.tensor([0, 0, 1, 1, 1, 1, 1, 1, 0]).bool()
    pos = sequence_mrope(flags, [(1, 2, 3)])
    assert pos.tolist() == [[0, 1, 2, 2, 2, 2, 2, 2, 5],
                            [0, 1, 2, 2, 2, 3, 3, 3, 5],
                            [0, 1, 2, 3, 4, 2, 3, 4, 5]]


def test_left_padded_positions_equal_the_models_own(vlm, batches):
    model, _ = vlm
    ids, mask, vision = batches
    pos, _, _ = image_inputs(model, ids, mask, vision)  # what the log-prob forwards use
    own = _own_positions(model, ids, mask, vision)
    for b in range(ids.shape[0]):
        real = mask[b].bool()
        assert torch.equal(pos[:, b, real], own[b])
        assert (pos[:, b, ~real] == 0).all()
    if not (ids[:, P:] == model.config.image_token_id).any():  # the rollout's call on placeholder-free rows agrees
        rollout_pos, nxt = vlm_position_ids(model, ids, mask, vision)
        assert torch.equal(rollout_pos, pos)
        assert all(nxt[b] == own[b].max() + 1 for b in range(ids.shape[0]))
    assert not torch.equal(own[1][0], torch.arange(own[1].shape[1]))  # images do shift positions


@pytest.mark.parametrize("rows", [1, 2])
def test_packed_positions_equal_the_models_own(vlm, batches, rows):
    model, _ = vlm
    ids, mask, vision = batches
    row_len = int(mask.sum()) if rows == 1 else int(mask.sum(-1).max())
    p = pack(ids, mask, row_len=row_len)
    assert (p.input_ids.shape[0] == 1) == (rows == 1)  # one row holds all sequences, or rows of the longest
    pos4, slots4, images = packed_vision(model, ids, mask, vision, p)
    flat = pos4.reshape(4, -1)
    own = _own_positions(model, ids, mask, vision)
    for b in range(ids.shape[0]):
        slots = p.dest[b][mask[b].bool()]
        seq = ids[b][mask[b].bool()][None]
        assert torch.equal(flat[1:, slots], own[b])
        assert torch.equal(flat[0, slots], torch.arange(len(slots)))  # text positions restart
        assert torch.equal(slots4.reshape(-1)[slots], _prompt_slots(model, seq, vision[b])[0])  # the padded mask, moved
    # images in the order their slots sit in the packed rows
    assert int(slots4.sum()) == sum(int(v.image_grid_thw.prod(-1).sum()) // 4 for v in images)
    starts = [int(p.dest[b][mask[b].bool()][0]) for b in range(3)]
    assert images == [vision[b] for b in sorted(range(3), key=starts.__getitem__) if vision[b] is not None]


def _reference_logprobs(model, ids, mask, vision, b):
    """The response log-probs of row b from the model's own forward on the unpadded sequence:
    its pixel_values and M-RoPE, or, when a response holds the placeholder id (which the model
    would take for an image token), its own image features scattered into the prompt's slots and
    its own get_rope_index with those slots as the image tokens."""
    real = mask[b].bool()
    seq = ids[b][real][None]
    with torch.no_grad():
        if vision[b] is None:
            logits = model(input_ids=seq).logits[0].float()
        elif not (seq[0, -T:] == model.config.image_token_id).any():
            logits = model(input_ids=seq, pixel_values=vision[b].pixel_values, image_grid_thw=vision[b].image_grid_thw,
                           mm_token_type_ids=(seq == model.config.image_token_id).long()).logits[0].float()
        else:
            slots = _prompt_slots(model, seq, vision[b])
            emb = model.get_input_embeddings()(seq)
            feats = torch.cat(model.model.get_image_features(vision[b].pixel_values,
                                                             vision[b].image_grid_thw).pooler_output)
            emb = emb.masked_scatter(slots[..., None].expand_as(emb), feats)
            pos = _own_positions(model, ids[b:b + 1], mask[b:b + 1], vision[b:b + 1])[0][:, None]
            logits = model(inputs_embeds=emb, position_ids=pos).logits[0].float()
    n_resp = int(mask[b, -T:].sum())
    lp = logits.log_softmax(-1)[:-1].gather(-1, seq[0, 1:, None])[:, 0]
    return lp[-n_resp:]


@pytest.mark.parametrize("fused", [True, False])
def test_logprobs_do_not_depend_on_padding_or_packing(vlm, batches, fused):
    model, _ = vlm
    ids, mask, vision = batches
    with torch.no_grad():
        padded, _ = response_logprobs(model, ids, mask, T, vision=vision, fused=fused)
        packed, _ = packed_response_logprobs(model, ids, mask, T, vision=vision, fused=fused, row_len=int(mask.sum()))
        packed2, _ = packed_response_logprobs(model, ids, mask, T, vision=vision, fused=fused)  # rows of the longest
        # the same rows with more left padding
        wider = torch.cat([torch.zeros(3, 7, dtype=ids.dtype), ids], 1), torch.cat([torch.zeros(3, 7, dtype=mask.dtype), mask], 1)
        more, _ = response_logprobs(model, *wider, T, vision=vision, fused=fused)
    for b in range(ids.shape[0]):
        ref = _reference_logprobs(model, ids, mask, vision, b)
        n = len(ref)
        for got in (padded, packed, packed2, more):
            torch.testing.assert_close(got[b, :n], ref, atol=1e-5, rtol=0)


def test_encoder_runs_once_per_distinct_prompt(vlm, batch):
    model, _ = vlm
    ids, mask, vision = batch
    n = 3
    rep = torch.arange(3).repeat_interleave(n)
    grouped = [vision[i] for i in rep.tolist()]  # a group's n samples share the reference
    counter = EncoderCounter(model)
    try:
        with torch.no_grad():
            lp, _ = response_logprobs(model, ids[rep], mask[rep], T, vision=grouped)
    finally:
        counter.close()
    assert counter.calls == 1 and counter.images == 3  # prompts 0 and 1: 1 + 2 images, once
    with torch.no_grad():
        single, _ = response_logprobs(model, ids, mask, T, vision=vision)
    torch.testing.assert_close(lp[::n], single, atol=1e-5, rtol=0)


def test_sft_target_logprobs_of_right_padded_image_rows(vlm, batch):
    from reinforge.models.forward import position_ids_from_mask, target_logprobs

    model, _ = vlm
    ids, mask, vision = batch
    # right-padded: each row's real tokens moved to the front
    lens = mask.sum(-1)
    right = torch.zeros_like(ids)
    rmask = torch.zeros_like(mask)
    for b in range(3):
        right[b, :lens[b]] = ids[b][mask[b].bool()]
        rmask[b, :lens[b]] = 1
    loss_mask = rmask.clone()
    for b in range(3):
        loss_mask[b, :lens[b] - int(mask[b, -T:].sum())] = 0  # the response tokens only
    sft = dict(input_ids=right, attention_mask=rmask, position_ids=position_ids_from_mask(rmask), loss_mask=loss_mask)
    with torch.no_grad():
        got = target_logprobs(model, sft, vision=vision)
    ref = torch.cat([_reference_logprobs(model, ids, mask, vision, b) for b in range(3)])
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


def test_frozen_tower_features_are_kept_across_passes():
    from reinforge.models.vlm_inputs import prompt_batch
    from reinforge.models.vlm_tiny import make_tiny_vlm

    model, proc = make_tiny_vlm(hidden_size=64, num_layers=2, seed=3)
    out = prompt_batch(proc, _prompts(), P)
    ids, mask, vision = out["input_ids"], out["attention_mask"], out["vision"]
    T0 = 4
    counter = EncoderCounter(model)
    try:
        model.model.visual.requires_grad_(False)
        first, _ = response_logprobs(model, ids, mask, T0, vision=vision)  # grad enabled: the update's pass
        assert counter.calls == 1
        again, _ = response_logprobs(model, ids, mask, T0, vision=vision)
        assert counter.calls == 1  # kept: no second encoding of the same prompts
        torch.testing.assert_close(again, first, atol=0, rtol=0)
        model.model.visual.requires_grad_(True)  # a tower that trains encodes every pass
        response_logprobs(model, ids, mask, T0, vision=vision)
        assert counter.calls == 2
    finally:
        counter.close()


def test_tower_key_is_per_object_and_counts_weight_loads():
    """A deep copy is another tower; loading weights into a tower (not into other parameters)
    moves its generation on, so features cached under its old weights are not read."""
    import copy

    from reinforge.models.vlm_forward import _tower_key, tower_weights_loaded

    a = torch.nn.Linear(2, 2)
    b = copy.deepcopy(a)
    assert _tower_key(a) == _tower_key(a) != _tower_key(b)
    assert _tower_key(a)[0] != _tower_key(b)[0]
    vlm = torch.nn.Module()
    vlm.model, vlm.head = torch.nn.Module(), torch.nn.Linear(2, 2)
    vlm.model.visual = a
    uid, generation = _tower_key(a)
    tower_weights_loaded(vlm, ["head.weight"])
    assert _tower_key(a) == (uid, generation)
    tower_weights_loaded(vlm, ["head.bias", "model.visual.weight"])
    assert _tower_key(a) == (uid, generation + 1)
    tower_weights_loaded(torch.nn.Linear(2, 2), ["weight"])  # no tower: nothing to do
