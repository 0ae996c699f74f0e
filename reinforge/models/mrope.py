"""M-RoPE: Qwen2-VL's 3-D position ids (temporal, height, width), as pure functions of the masks.

Text tokens get the same position on all three axes, counting up by one. An image of merged
grid (t, h, w) placed after position s gets (s + ti, s + hi, s + wi) for its t*h*w tokens in
row-major order, and the text after it continues from s + max(h, w) (not s + t*h*w): an image
costs max(h, w) positions, so the positions of a sequence stop being 0..n-1 and the next
token's position is the sequence's max + 1, not its length.

Where VLM RL frameworks get this wrong (seed 004): the positions must be those of each sequence
on its own, whatever the padding or packing around it. Here they are computed on each
sequence's real tokens (attention_mask == 1) only, so
- left padding: pads get 0 (as `forward.position_ids_from_mask` gives them), real tokens the
  unpadded sequence's positions;
- packing: `packed_mrope` moves the padded positions into the packed slots (restarting per
  sequence by construction) and prepends the text positions 0..n-1, the row transformers'
  Qwen2-VL language model reads to find the packed sequences' boundaries (4 rows: text, t, h, w).
tests/test_vlm_mrope.py checks both against the model's own `get_rope_index` on each
unpadded sequence.

Shapes: B sequences, L tokens, K images in the batch (in token order), R x C packed slots.
"""
from __future__ import annotations

import torch


def _runs(flags: torch.Tensor) -> list[tuple[bool, int, int]]:
    """(n,) bool -> maximal runs (value, start, end) in order."""
    n = flags.shape[0]
    if n == 0:
        return []
    change = (flags[1:] != flags[:-1]).nonzero()[:, 0] + 1
    bounds = [0, *change.tolist(), n]
    return [(bool(flags[a]), a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def sequence_mrope(image_flags: torch.Tensor, grids: list[tuple[int, int, int]]) -> torch.Tensor:
    """Positions (3, n) of one unpadded sequence. image_flags (n,) bool marks image tokens;
    grids: the merged (t, h, w) of each image in order (one contiguous run of image tokens each)."""
    n = image_flags.shape[0]
    out = torch.empty(3, n, dtype=torch.long, device=image_flags.device)
    cur, k = 0, 0
    for is_image, a, b in _runs(image_flags):
        if not is_image:
            out[:, a:b] = torch.arange(cur, cur + b - a, device=out.device)
            cur += b - a
            continue
        if k >= len(grids):
            raise ValueError(f"more image-token runs than images ({len(grids)})")
        t, h, w = grids[k]
        if t * h * w != b - a:
            raise ValueError(f"image {k}: {b - a} image tokens for a merged grid {t}x{h}x{w}")
        ti, hi, wi = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
        out[:, a:b] = torch.stack([ti, hi, wi]).reshape(3, -1).to(out.device) + cur
        cur += max(h, w)
        k += 1
    if k != len(grids):
        raise ValueError(f"{len(grids)} images for {k} image-token runs")
    return out


def merged_grids(image_grid_thw: torch.Tensor, spatial_merge_size: int) -> list[tuple[int, int, int]]:
    """(K, 3) patch grids (the processor's image_grid_thw) -> merged (t, h // m, w // m) each."""
    m = spatial_merge_size
    return [(int(t), int(h) // m, int(w) // m) for t, h, w in image_grid_thw.tolist()]


def mrope_position_ids(attention_mask: torch.Tensor, image_mask: torch.Tensor, image_grid_thw: torch.Tensor | None,
                       spatial_merge_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, L) 0/1 mask, (B, L) bool image-token mask, (K, 3) grids of the batch's images in
    token order -> positions (3, B, L) (0 on pads) and next_position (B,): the position of a
    token appended after each row (max real position + 1; 0 for an empty row), where decoding
    continues."""
    B, L = attention_mask.shape
    grids = merged_grids(image_grid_thw, spatial_merge_size) if image_grid_thw is not None else []
    pos = torch.zeros(3, B, L, dtype=torch.long, device=attention_mask.device)
    nxt = torch.zeros(B, dtype=torch.long, device=attention_mask.device)
    real = attention_mask.bool()
    k = 0
    for b in range(B):
        flags = image_mask[b][real[b]]
        n_img = sum(1 for is_image, _, _ in _runs(flags) if is_image)
        p = sequence_mrope(flags, grids[k:k + n_img])
        k += n_img
        pos[:, b, real[b]] = p
        nxt[b] = p.max() + 1 if p.numel() else 0
    if k != len(grids):
        raise ValueError(f"{len(grids)} images for {k} image-token runs in the batch")
    return pos, nxt


def packed_mrope(padded_pos: torch.Tensor, text_pos: torch.Tensor, dest: torch.Tensor) -> torch.Tensor:
    """Padded M-RoPE positions (3, B, L) -> packed (4, R, C): row 0 the packed text positions
    `text_pos` (R, C) (models/packing.pack's, restarting at 0 per sequence), rows 1-3 each real
    token's (t, h, w) moved to its slot `dest` (B, L) (-1 where masked); pad slots 0."""
    R, C = text_pos.shape
    valid = dest >= 0
    flat = torch.zeros(3, R * C, dtype=padded_pos.dtype, device=padded_pos.device)
    flat[:, dest[valid]] = padded_pos[:, valid]
    return torch.cat([text_pos[None], flat.view(3, R, C)], dim=0)
