"""`reinforge demo --task count_shapes`: the visual demo's SFT stop rule, its text-only control
data, and a few-step run end to end whose report shows the training samples' pictures."""
from __future__ import annotations

import io
import json

import pytest
from PIL import Image

from reinforge.cli import demo_vision_sft
from reinforge.cli.demo_vision import blank_rows
from reinforge.cli.main import main
from reinforge.data.io import load_rows
from reinforge.tasks import make_task_data


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    from reinforge.models.vlm_tiny import make_tiny_vlm

    root = tmp_path_factory.mktemp("demo_vision")
    files = make_task_data("count_shapes", str(root / "data"), n_train=8, n_test=4, n_sft=16, seed=0)
    model, proc = make_tiny_vlm(hidden_size=32, num_layers=1, intermediate_size=64, vision_embed_dim=32,
                                min_pixels=56 * 56, max_pixels=56 * 56)
    return files, model, proc


def _sft(shapes, **kw):
    files, model, proc = shapes
    import copy

    model = copy.deepcopy(model)
    args = dict(lr=1e-3, warmup_steps=2, batch_size=4, max_steps=4, check_every=2, stop_acc=0.0, seed=1,
                log=lambda _: None) | kw
    return demo_vision_sft.run_vision_sft(model, proc, load_rows(files["sft"]), load_rows(files["train"]), **args)


def test_sft_runs_to_the_cap_without_the_rule_and_is_deterministic(shapes):
    first, again = _sft(shapes), _sft(shapes)
    assert first["steps"] == 4 and [h["step"] for h in first["history"]] == [2, 4]
    assert first["history"] == again["history"]  # same seed, same losses and checks


def test_sft_stops_at_the_first_check_reaching_the_threshold(shapes, monkeypatch):
    scores = iter([(0.3, 0.3), (0.5, 0.3), (0.9, 0.3)])
    monkeypatch.setattr(demo_vision_sft, "dev_scores", lambda *a, **k: next(scores))
    out = _sft(shapes, max_steps=10, stop_acc=0.45)
    assert out["steps"] == 4 and out["dev_acc"] == 0.5 and [h["dev_acc"] for h in out["history"]] == [0.3, 0.5]


def test_sft_stop_also_needs_the_answers_probability(shapes, monkeypatch):
    # greedy past the threshold while the answer's mean probability is at chance: keep going
    scores = iter([(0.5, 0.21), (0.45, 0.24), (0.6, 0.31), (0.9, 0.5)])
    monkeypatch.setattr(demo_vision_sft, "dev_scores", lambda *a, **k: next(scores))
    out = _sft(shapes, max_steps=10, stop_acc=0.4, stop_prob=0.25)
    assert out["steps"] == 6 and (out["dev_acc"], out["dev_prob"]) == (0.6, 0.31)
    assert [h["dev_prob"] for h in out["history"]] == [0.21, 0.24, 0.31]


def _by_hand(shapes):
    """The test rows encoded, their answers (N,), the digit ids and the model's own first-response
    logits (N, V), from one forward of the whole batch."""
    files, model, proc = shapes
    import torch

    rows = load_rows(files["test"])
    enc, answers = demo_vision_sft.encode_rows(proc, rows)
    digits = torch.tensor([proc.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)])
    with torch.no_grad():
        logits = model(**{k: enc[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_grid_thw",
                                               "mm_token_type_ids")}).logits[:, -1]
    return rows, enc, answers, digits, logits


def test_dev_scores_are_the_argmax_and_the_answers_probability(shapes):
    import torch

    rows, enc, answers, digits, logits = _by_hand(shapes)
    target = digits[answers]
    acc, prob = demo_vision_sft.dev_scores(shapes[1], enc, answers, digits, chunk=3)
    assert acc == int((logits.argmax(-1) == target).sum()) / len(rows)
    assert prob == pytest.approx(float(logits.softmax(-1)[torch.arange(len(rows)), target].mean()), abs=1e-6)
    assert 0 < prob < 1


def test_greedy_accuracy_scores_the_answer_token(shapes):
    rows, enc, answers, digits, logits = _by_hand(shapes)
    pred = logits.argmax(-1)
    by_hand = sum(int(p == digits[a]) for p, a in zip(pred.tolist(), answers.tolist())) / len(rows)
    assert demo_vision_sft.greedy_accuracy(shapes[1], enc, answers, digits, chunk=3) == by_hand
    assert answers.tolist() == [int(r["reward_model"]["ground_truth"]) for r in rows]


def test_text_only_control_blanks_every_picture_and_keeps_the_rest(shapes):
    rows = load_rows(shapes[0]["train"])
    blank = blank_rows(rows)
    for r, b in zip(rows, blank):
        img = Image.open(io.BytesIO(b["images"][0]["bytes"]))
        assert img.size == Image.open(io.BytesIO(r["images"][0]["bytes"])).size
        assert img.convert("RGB").getcolors() == [(56 * 56, (255, 255, 255))]
        assert {k: v for k, v in b.items() if k != "images"} == {k: v for k, v in r.items() if k != "images"}


def test_report_shows_a_logged_samples_pictures(tmp_path):
    from reinforge.data.images import thumbnail_uri
    from reinforge.report.render import write_report

    uri = thumbnail_uri(Image.new("RGB", (300, 150), (220, 30, 30)))
    small = Image.open(io.BytesIO(__import__("base64").b64decode(uri.split(",", 1)[1])))
    assert small.size == (128, 64) and small.getpixel((5, 5)) == (220, 30, 30)  # shrunk, colours kept
    (tmp_path / "samples").mkdir()
    rows = [{"group": 0, "prompt": "p", "response": "3", "images": [uri]}, {"group": 0, "prompt": "p", "response": "4"},
            {"group": 1, "prompt": "q", "response": "1", "images": ["javascript:alert(1)"]}]  # not a PNG URI: dropped
    (tmp_path / "samples" / "train_step_1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "actor/pg_loss": 0.1}) + "\n")
    html = write_report(tmp_path).read_text()
    assert html.count('<img class="sample"') == 1 and uri in html and "javascript" not in html


@pytest.mark.slow
def test_demo_count_shapes_quick_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--task", "count_shapes", "--quick", "--seed", "1", "--out", str(out)]) == 0
    assert "SFT base" in capsys.readouterr().out
    report = json.loads((out / "demo_report.json").read_text())
    assert report["seed"] == 1 and report["task"]["task"] == "count_shapes" and not report["text_only"]
    assert report["sft"]["steps"] == 3 and 0 <= report["blank_image"]["rl"] <= 1
    assert 0.0 <= report["rl"]["acc_greedy"] <= 1.0 and (out / "sft" / "hf" / "config.json").exists()
    # the report shows the logged training samples with their pictures, one per group
    samples = [json.loads(x) for x in (out / "grpo" / "samples" / "train_step_2.jsonl").read_text().splitlines()]
    with_images = [s for s in samples if "images" in s]
    assert len(with_images) == len({s["group"] for s in samples}) == 4
    html = (out / "grpo" / "report" / "index.html").read_text()
    assert html.count('<img class="sample"') == 4 and with_images[0]["images"][0] in html
