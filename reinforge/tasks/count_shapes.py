"""`count_shapes`: a picture of coloured shapes and the question "How many red shapes?" -> "3".

The built-in visual task (issue 25): the answer is in the pixels only. Every prompt has the same
text, so a model that does not look at the image can do no better than guessing the most
common count: with the default counts 1..5 drawn uniformly, chance is 1/5 (20%).

The picture (`size` x `size` RGB, white background) is a grid of 14-pixel cells, `size // 14`
a side; 56 px -> a 4x4 grid. 14 px is Qwen2-VL's patch, so every cell is one patch and a 56-px
picture is 4 merged image tokens (2x2 patches each); the default 56 therefore gives a tiny
model 4 image tokens, 84 px 9. Each cell holds at most one shape, so shapes never overlap:

    k in [min_count, max_count] red shapes (the answer)   colour (220, 30, 30)
    m in [0, max_distractors] blue or green shapes          (30, 60, 220), (30, 160, 60)

each a filled square, circle or triangle 8-10 px wide at a 1-3 px offset inside its cell. The
distractors make the total number of shapes a poor guide: the colour has to be seen. Red, blue
and green are far apart in every channel, and 8 px spans most of a patch, so a patch-level
vision encoder has a strong signal to count.

Rows (tasks.make_task_data) follow veRL's multimodal schema: prompt
[{"role": "user", "content": "<image>How many red shapes?"}] and an `images` column of one
{"bytes": PNG, "path": None}; the data loaders turn them into the canonical form of
reinforge.data.images. Scored by exact match of the stripped response.
"""

from __future__ import annotations

import functools
import io
import random

from reinforge.tasks.base import Example, Task

CELL = 14  # pixels: Qwen2-VL's patch size, one shape per cell
TARGET = "red"
COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 160, 60)}
DISTRACTORS = ("blue", "green")
SHAPES = ("square", "circle", "triangle")
QUESTION = f"How many {TARGET} shapes?"
WHITE = (255, 255, 255)


def layout(rng: random.Random, grid: int, min_count: int, max_count: int, max_distractors: int) -> list[tuple]:
    """The scene: one (cell, colour, shape, dx, dy, side) per shape, targets first, in distinct
    cells of a grid x grid board (cell = row * grid + column)."""
    k = rng.randint(min_count, max_count)
    m = rng.randint(0, max_distractors)
    cells = rng.sample(range(grid * grid), k + m)
    scene = []
    for i, cell in enumerate(cells):
        colour = TARGET if i < k else rng.choice(DISTRACTORS)
        scene.append((cell, colour, rng.choice(SHAPES), rng.randint(1, 3), rng.randint(1, 3), rng.randint(8, 10)))
    return scene


def draw(scene: list[tuple], size: int):
    """The scene as a `size` x `size` PIL RGB image."""
    from PIL import Image, ImageDraw  # imported on use: reward workers import this module too

    grid = size // CELL
    image = Image.new("RGB", (size, size), WHITE)
    pen = ImageDraw.Draw(image)
    for cell, colour, shape, dx, dy, side in scene:
        x0, y0 = (cell % grid) * CELL + dx, (cell // grid) * CELL + dy
        x1, y1 = x0 + side - 1, y0 + side - 1  # Pillow's boxes include both corners: `side` pixels wide
        fill = COLOURS[colour]
        if shape == "square":
            pen.rectangle([x0, y0, x1, y1], fill=fill)
        elif shape == "circle":
            pen.ellipse([x0, y0, x1, y1], fill=fill)
        else:
            pen.polygon([(x0, y1), (x1, y1), ((x0 + x1) // 2, y0)], fill=fill)
    return image


def png_bytes(image) -> bytes:
    """The image as PNG bytes (lossless, so every pixel colour survives; deterministic)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _sample(rng: random.Random, size: int, min_count: int, max_count: int, max_distractors: int) -> Example:
    scene = layout(rng, size // CELL, min_count, max_count, max_distractors)
    k = sum(colour == TARGET for _, colour, *_ in scene)
    # A wrong count in range (the rejected side of preference pairs): a neighbour when possible.
    others = [c for c in (k - 1, k + 1) if min_count <= c <= max_count] or [k + 1]
    return Example(prompt=QUESTION, answer=str(k), ground_truth=str(k), wrong=str(rng.choice(others)),
                   images=(png_bytes(draw(scene, size)),))


def make_count_shapes(size: int = 56, min_count: int = 1, max_count: int = 5, max_distractors: int = 3) -> Task:
    """Count the red shapes in a `size`-pixel picture; counts min_count..max_count, up to
    max_distractors shapes of other colours. Chance (a text-only model) is
    1 / (max_count - min_count + 1). `size` is a multiple of 28 (Qwen2-VL's 2x2 merged patches,
    so the processor does not resize it) in 28..224."""
    from reinforge.rewards.builtin import exact_match  # on use: reinforge.rewards imports TASKS

    if not isinstance(size, int) or size % 28 or not 28 <= size <= 224:
        raise ValueError(f"count_shapes: size must be a multiple of 28 in 28..224, got {size!r}")
    if not 0 <= min_count <= max_count <= 9:
        raise ValueError(f"count_shapes: need 0 <= min_count <= max_count <= 9 (one-digit answers), "
                         f"got min_count={min_count}, max_count={max_count}")
    cells = (size // CELL) ** 2
    if max_distractors < 0 or max_count + max_distractors > cells:
        raise ValueError(f"count_shapes: max_count + max_distractors = {max_count + max_distractors} shapes do not fit "
                         f"the {cells} cells of a {size}-px picture (one shape per {CELL}-px cell); "
                         f"max_distractors must be in 0..{cells - max_count}")
    return Task(
        name="count_shapes",
        ability="vision",
        sample=functools.partial(_sample, size=size, min_count=min_count, max_count=max_count,
                                 max_distractors=max_distractors),
        score=exact_match,
        options={"size": size, "min_count": min_count, "max_count": max_count, "max_distractors": max_distractors},
    )
