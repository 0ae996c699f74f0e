"""count_shapes, the built-in visual task: the answer is in the pixels and only there."""
import collections
import io
import random

import pytest
from PIL import Image

from reinforge.data import DataError, load_rows
from reinforge.rewards.registry import auto_reward, load_reward_fn
from reinforge.tasks import get_task, make_task_data
from reinforge.tasks.count_shapes import COLOURS, QUESTION


def red_blobs(image: Image.Image) -> int:
    """Connected groups (4-neighbour) of the task's red pixels, counted by flood fill."""
    w, h = image.size
    red = {(x, y) for y in range(h) for x in range(w) if image.getpixel((x, y)) == COLOURS["red"]}
    blobs = 0
    while red:
        blobs += 1
        stack = [red.pop()]
        while stack:
            x, y = stack.pop()
            for nb in ((x + 1, y), (x - 1, y), (x, y + 1), (x, y - 1)):
                if nb in red:
                    red.remove(nb)
                    stack.append(nb)
    return blobs


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return make_task_data("count_shapes", str(tmp_path_factory.mktemp("shapes")), n_train=150, n_test=50, n_sft=20,
                          seed=0)


def test_the_image_shows_the_answer_and_the_text_does_not(files):
    rows = load_rows(files["train"]) + load_rows(files["test"])
    assert {r["prompt"][0]["content"] for r in rows} == {"<image>" + QUESTION}  # one question for every row
    answers = collections.Counter(r["reward_model"]["ground_truth"] for r in rows)
    assert set(answers) == {"1", "2", "3", "4", "5"}
    assert max(answers.values()) / len(rows) < 0.3  # no answer a text-only model could bet on (chance 20%)
    for r in rows[:60]:
        image = Image.open(io.BytesIO(r["images"][0]["bytes"]))
        assert image.size == (56, 56) and image.mode == "RGB"
        assert red_blobs(image) == int(r["reward_model"]["ground_truth"])  # shapes never touch: one blob each


def test_seeded_and_options(tmp_path):
    task = get_task("count_shapes", size=84, min_count=2, max_count=3, max_distractors=0)
    a, b = task.sample(random.Random(5)), task.sample(random.Random(5))
    assert a == b and a.answer in {"2", "3"} and a.wrong in {"2", "3"} and a.wrong != a.answer
    image = Image.open(io.BytesIO(a.images[0]))
    assert image.size == (84, 84) and red_blobs(image) == int(a.answer)
    # no distractors: every coloured pixel is red
    assert {image.getpixel((x, y)) for x in range(84) for y in range(84)} <= {(255, 255, 255), COLOURS["red"]}
    for bad, message in ((dict(size=60), "multiple of 28"), (dict(max_count=10), "max_count <= 9"),
                         (dict(size=28, max_distractors=1), "do not fit the 4 cells")):
        with pytest.raises(DataError, match=message):
            get_task("count_shapes", **bad)


def test_verifier_on_hand_cases():
    score = load_reward_fn("count_shapes")
    assert [score(QUESTION, r, "3") for r in ("3", " 3\n", "4", "three", "33", "")] == [1, 1, 0, 0, 0, 0]
    assert auto_reward(QUESTION, "3", "3", data_source="count_shapes") == 1.0
