"""SFT and DPO on image rows with a tiny Qwen2-VL: veRL's schema (count_shapes' files: an
`images` column, `<image>` in the prompt) and TRL's (an `image` column beside prompt/completion,
`images` beside messages, `images` beside prompt/chosen/rejected). One step each trains the
language model and leaves a frozen vision tower as it was; the loss counts the response tokens
only and equals the per-row computation on each unpadded sequence through the model's own
forward; bad image rows are refused when the data loads, before any model does."""
from __future__ import annotations

import io
import json
import math
import re

import pytest
import torch
from PIL import Image

from reinforge.config.load import ConfigError, load_config
from reinforge.config.sft import SFTConfig
from reinforge.data import load_rows, write_rows
from reinforge.data.io import DataError
from reinforge.tasks import make_task_data
from reinforge.trainers.sft import SFTTrainer, collate_rows

QUESTION = "How many red shapes?"


@pytest.fixture(scope="module")
def vlm_data(tmp_path_factory):
    """The tiny VLM's folder and image row files: {"model", "sft_verl", "sft_trl", "sft_messages",
    "prefs_verl", "prefs_trl"}."""
    from reinforge.models.vlm_tiny import make_tiny_vlm

    root = tmp_path_factory.mktemp("vlm_sft")
    make_tiny_vlm(str(root / "model"), hidden_size=64, num_layers=2)
    files = make_task_data("count_shapes", str(root / "shapes"), n_train=2, n_test=2, n_sft=6, seed=0)
    sft = load_rows(files["sft"])
    user = [{"role": "user", "content": QUESTION}]
    out = {"model": str(root / "model"), "sft_verl": files["sft"], "prefs_verl": files["prefs"], "test_verl": files["test"]}
    # TRL: the image in its own column beside a placeholder-free conversational prompt/completion
    out["sft_trl"] = write_rows([{"prompt": user, "completion": [{"role": "assistant", "content": r["response"]}],
                                  "image": {"bytes": r["images"][0]["bytes"]}} for r in sft],
                                str(root / "trl" / "sft.parquet"))
    # TRL's vision conversational language modelling: messages with image parts, an images column
    parts = [{"type": "image"}, {"type": "text", "text": QUESTION}]
    out["sft_messages"] = write_rows(
        [{"messages": [{"role": "user", "content": parts},
                       {"role": "assistant", "content": [{"type": "text", "text": r["response"]}]}],
          "images": [{"bytes": r["images"][0]["bytes"]}]} for r in sft], str(root / "trl" / "messages.parquet"))
    prefs = load_rows(files["prefs"])
    out["prefs_trl"] = write_rows([{"prompt": [{"role": "user", "content": parts}], "images": r["images"],
                                    "chosen": [{"role": "assistant", "content": r["chosen"]}],
                                    "rejected": [{"role": "assistant", "content": r["rejected"]}]} for r in prefs],
                                  str(root / "trl" / "prefs.parquet"))
    return out


def _sft_cfg(model: str, train: str, run_dir, **extra) -> SFTConfig:
    base = {"model.path": model, "data.train_files": f"[{train}]", "data.max_length": 64, "data.batch_size": 4,
            "optim.micro_batch_size": 2, "optim.lr": 1e-2, "optim.warmup_steps": 0, "trainer.total_steps": 1,
            "trainer.run_dir": str(run_dir), "trainer.loggers": "[jsonl]", "trainer.progress": False,
            "trainer.export_hf": False, "trainer.save_every": 0}
    base.update(extra)
    return load_config(SFTConfig, "sft", [f"{k}={v}" for k, v in base.items()])


def _params(model, vision: bool) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in model.named_parameters() if ("visual" in k) == vision}


def _assert_trained(before_tower, before_lm, model, *, lora: bool = False):
    tower, lm = _params(model, True), _params(model, False)
    assert before_tower and all(torch.equal(before_tower[k], tower[k]) for k in tower), "the vision tower changed"
    changed = {k for k in before_lm if not torch.equal(before_lm[k], lm[k])}
    assert changed, "the language model did not train"
    if lora:
        assert all("lora_" in k for k in changed)


def _last_metrics(run_dir) -> dict:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()][-1]


@pytest.mark.parametrize("schema", ["verl", "trl", "messages", "lora", "unfrozen"])
def test_sft_step_on_image_rows(schema, vlm_data, tmp_path):
    train = vlm_data["sft_trl" if schema == "trl" else "sft_messages" if schema == "messages" else "sft_verl"]
    extra = {"lora": {"model.lora_rank": 4, "model.lora_target_modules": "[q_proj,v_proj]"},
             "unfrozen": {"model.freeze_vision_tower": False}}.get(schema, {})
    if schema == "trl":  # validation loss and accuracy on image rows, the export (with its image processor)
        extra.update({"data.val_files": f"[{vlm_data['sft_verl']}]", "trainer.export_hf": True,
                      "eval.prompt_files": f"[{vlm_data['test_verl']}]", "eval.reward_functions": "[{name: exact_match}]",
                      "eval.max_prompt_length": 64, "eval.max_response_length": 3, "eval.n": 2, "eval.pass_k": "[1,2]"})
    trainer = SFTTrainer(_sft_cfg(vlm_data["model"], train, tmp_path / "run", **extra))
    assert all(r["vision"] is not None for r in trainer.train_rows)
    tower, lm = _params(trainer.model, True), _params(trainer.model, False)
    final = trainer.fit()
    step = _last_metrics(tmp_path / "run")
    assert step["step"] == 1 and math.isfinite(step["train/loss"]) and math.isfinite(step["train/grad_norm"])
    if schema == "unfrozen":  # model.freeze_vision_tower=false: the tower trains with the language model
        after = _params(trainer.model, True)
        assert any(not torch.equal(tower[k], after[k]) for k in tower)
        return
    _assert_trained(tower, lm, trainer.model, lora=schema == "lora")
    if schema == "trl":
        from reinforge.models.loading import load_causal_lm, load_vlm_processor

        assert math.isfinite(final["val/loss"]) and 0.0 <= final["val/acc_greedy"] <= 1.0 and "val/pass@2" in final
        exported = str(tmp_path / "run" / "hf")
        assert load_vlm_processor(exported).image_processor is not None
        assert hasattr(load_causal_lm(exported, train=False).model, "visual")


@pytest.mark.parametrize("schema", ["verl", "trl", "messages"])
def test_sft_loss_mask_is_the_response(schema, vlm_data, tmp_path):
    """Hand check: the loss-masked tokens decode to the answer and the end of turn, the rest to
    the rendered prompt with its image tokens expanded."""
    trainer = SFTTrainer(_sft_cfg(vlm_data["model"], vlm_data[f"sft_{schema}"], tmp_path / "run"))
    tok = trainer.tok
    answers = [r["response"] for r in load_rows(vlm_data["sft_verl"])]
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    for row, answer in zip(trainer.train_rows, answers):
        ids, mask = row["input_ids"], row["loss_mask"]
        target = tok.decode([t for t, m in zip(ids, mask) if m])
        context = tok.decode([t for t, m in zip(ids, mask) if not m])
        assert target == answer + "<|im_end|>", target
        n_img = int(row["vision"].image_grid_thw.prod(-1).sum()) // 4
        assert context.count("<|image_pad|>") == n_img == sum(t == pad for t in ids) > 0
        assert context.startswith("<|im_start|>user\n<|vision_start|>") and context.endswith(
            f"{QUESTION}<|im_end|>\n<|im_start|>assistant\n"), context
        assert mask == sorted(mask)  # the context, then the targets


def test_sft_loss_equals_the_per_row_unpadded_computation(vlm_data, tmp_path):
    """The trainer's loss over a right-padded micro-batch of image rows of different lengths (one
    whose completion spells the image placeholder: text, not an image slot) equals the mean NLL
    of the target tokens computed row by row through the model's own forward (pixel_values,
    its own M-RoPE), with the placeholder in the completion given an embedding of its own."""
    rows = load_rows(vlm_data["sft_verl"])[:3]
    rows[1] = {**rows[1], "response": "2<|image_pad|> more words"}  # longer, and spells the placeholder
    train = write_rows(rows, str(tmp_path / "odd.parquet"))
    trainer = SFTTrainer(_sft_cfg(vlm_data["model"], train, tmp_path / "run"))
    model, items = trainer.model.eval(), trainer.train_rows
    lens = {len(it["input_ids"]) for it in items}
    assert len(lens) > 1  # right padding in the batch
    batch = trainer._to_device(collate_rows(items, trainer.tok.pad_token_id))
    n_tokens = sum(sum(it["loss_mask"][1:]) for it in items)
    with torch.no_grad():
        got, _ = trainer._nll(batch, None, n_tokens)
    image_id = model.config.image_token_id
    spelled = items[1]["input_ids"].count(image_id) - int(items[1]["vision"].image_grid_thw.prod(-1).sum()) // 4
    last = len(items[1]["input_ids"]) - 1 - items[1]["input_ids"][::-1].index(image_id)
    assert spelled == 1 and items[1]["loss_mask"][last] == 1  # a target token, not an image slot
    total = 0.0
    for it in items:
        ids = torch.tensor([it["input_ids"]])
        n_img = int(it["vision"].image_grid_thw.prod(-1).sum()) // 4
        slots = (ids == image_id) & ((ids == image_id).cumsum(-1) <= n_img)
        # the model's own forward, with the completion's placeholder as a text token (its own
        # embedding row): shown to the model as inputs_embeds with the image features scattered
        with torch.no_grad():
            emb = model.get_input_embeddings()(ids)
            feats = torch.cat(model.model.get_image_features(it["vision"].pixel_values,
                                                             it["vision"].image_grid_thw).pooler_output)
            emb = emb.masked_scatter(slots[..., None].expand_as(emb), feats)
            pos, _ = model.model.get_rope_index(torch.where(slots | (ids != image_id), ids, 0),
                                                mm_token_type_ids=slots.long(), image_grid_thw=it["vision"].image_grid_thw)
            logits = model(inputs_embeds=emb, position_ids=pos).logits[0].float()
        lp = logits.log_softmax(-1)[:-1].gather(-1, ids[0, 1:, None])[:, 0]
        total -= float(lp[torch.tensor(it["loss_mask"][1:]).bool()].sum())
    torch.testing.assert_close(float(got), total / n_tokens, atol=1e-5, rtol=0)


def _write_bad_rows(tmp_path, vlm_data) -> dict[str, str]:
    good = load_rows(vlm_data["sft_verl"])[0]
    png = io.BytesIO()
    Image.new("RGB", (20, 20), "red").save(png, format="PNG")
    cases = {"bytes": {**good, "images": [{"bytes": b"not a png at all", "path": None}]},
             "count": {**good, "prompt": [{"role": "user", "content": "<image><image>" + QUESTION}]},
             "missing": {**good, "images": [{"bytes": None, "path": "absent.png"}]}}
    return {k: write_rows([good, row], str(tmp_path / f"bad_{k}.parquet")) for k, row in cases.items()}


@pytest.mark.parametrize("case,message", [
    ("bytes", "row 1: field 'images[0]': unreadable image"),
    ("count", "row 1: field 'prompt': the prompt has 2 image placeholder(s)"),
    ("missing", "row 1: field 'images[0]': image file"),
    ("pixels", "row 0: field 'images[0]': image is 56x56 = 3136 pixels > data.max_pixels=3000"),
    ("text_model", "the row has images but the model has no image processor"),
])
def test_sft_refuses_bad_image_rows_before_a_model_loads(case, message, vlm_data, tmp_path, tiny_model_dir,
                                                         no_model_loads):
    bad = _write_bad_rows(tmp_path, vlm_data)
    model, train, extra = vlm_data["model"], bad.get(case, vlm_data["sft_verl"]), {}
    if case == "pixels":
        extra["data.max_pixels"] = 3000
    elif case == "text_model":
        model = tiny_model_dir
    with pytest.raises((DataError, ConfigError), match=re.escape(message)) as err:
        SFTTrainer(_sft_cfg(model, train, tmp_path / "run", **extra))
    assert "\n" not in str(err.value)


def test_sft_dry_run_reads_image_rows(vlm_data, tmp_path, capsys, no_model_loads):
    """`reinforge sft --dry-run` with a VLM folder reads its image rows with the processor."""
    from reinforge.cli.main import main

    args = [f"model.path={vlm_data['model']}", f"data.train_files=[{vlm_data['sft_verl']}]", "data.max_length=64",
            f"trainer.run_dir={tmp_path / 'run'}"]
    assert main(["sft", "--dry-run", *args]) == 0
    assert "data.train_files: 6 rows" in capsys.readouterr().out


# ---- DPO ------------------------------------------------------------------------------------
def _dpo_cfg(model: str, train: str, run_dir, **extra):
    from reinforge.config.preference import DPOConfig

    base = {"model.path": model, "data.train_files": f"[{train}]", "data.val_fraction": 0.0, "data.max_length": 64,
            "data.batch_size": 4, "optim.micro_batch_size": 2, "trainer.total_steps": 1, "optim.lr": 1e-2,
            "optim.warmup_steps": 0, "dpo.beta": 0.5, "trainer.run_dir": str(run_dir), "trainer.progress": False,
            "trainer.loggers": "[jsonl]", "trainer.val_before_train": False, "trainer.export_hf": False,
            "trainer.save_every": 0}
    base.update(extra)
    return load_config(DPOConfig, "dpo", [f"{k}={v}" for k, v in base.items()])


@pytest.mark.parametrize("schema", ["verl", "trl", "lora", "kto"])
def test_dpo_step_on_image_prompts(schema, vlm_data, tmp_path):
    """One step: at step 1 the policy is the reference, so the sigmoid loss is log 2 with zero
    rewards whatever the images do (the reference saw the same images through the same path)."""
    from reinforge.trainers.dpo import DPOTrainer

    extra = {"lora": {"model.lora_rank": 4, "model.lora_target_modules": "[q_proj,v_proj]"},
             "kto": {"dpo.loss_type": "kto"}, "trl": {"trainer.export_hf": True}}.get(schema, {})
    trainer = DPOTrainer(_dpo_cfg(vlm_data["model"], vlm_data["prefs_trl" if schema == "trl" else "prefs_verl"],
                                  tmp_path / "run", **extra))
    assert all(trainer.train[i]["vision"] is not None for i in range(len(trainer.train)))
    tower, lm = _params(trainer.model, True), _params(trainer.model, False)
    trainer.fit()
    step = _last_metrics(tmp_path / "run")
    assert step["step"] == 1 and math.isfinite(step["loss"]) and math.isfinite(step["grad_norm"])
    if schema != "kto":
        assert step["loss"] == pytest.approx(math.log(2), abs=1e-5)
        assert abs(step["rewards/chosen"]) < 1e-5 and abs(step["rewards/rejected"]) < 1e-5
    _assert_trained(tower, lm, trainer.model, lora=schema == "lora")
    if schema == "trl":
        from reinforge.models.loading import load_vlm_processor

        assert load_vlm_processor(str(tmp_path / "run" / "hf")).image_processor is not None


def _own_sequence_logps(model, batch: dict, b: int) -> float:
    """Row b's summed response log-prob from the model's own forward on the unpadded sequence
    (pixel_values and its own M-RoPE)."""
    real = batch["attention_mask"][b].bool()
    seq = batch["input_ids"][b][real][None]
    v = batch["vision"][b]
    with torch.no_grad():
        logits = model(input_ids=seq, pixel_values=v.pixel_values, image_grid_thw=v.image_grid_thw,
                       mm_token_type_ids=(seq == model.config.image_token_id).long()).logits[0].float()
    lp = logits.log_softmax(-1)[:-1].gather(-1, seq[0, 1:, None])[:, 0]
    return float(lp[batch["loss_mask"][b][real][1:].bool()].sum())


def test_dpo_reference_logps_through_the_image_path(vlm_data, tmp_path):
    """The live reference's and the precomputed reference's summed log-probs of the chosen and
    rejected rows equal the per-row unpadded computation; the loss mask holds the response (and
    its EOS) only; chosen and rejected rows share their prompt's one encoding."""
    from reinforge.models.vlm_forward import EncoderCounter
    from reinforge.trainers.dpo import DPOTrainer
    from reinforge.trainers.preference_common import pair_tensors

    live = DPOTrainer(_dpo_cfg(vlm_data["model"], vlm_data["prefs_trl"], tmp_path / "live"))
    cached = DPOTrainer(_dpo_cfg(vlm_data["model"], vlm_data["prefs_trl"], tmp_path / "cached",
                                 **{"dpo.precompute_ref": True}))
    items = [live.train[i] for i in range(3)]
    batch = pair_tensors(items, live.pad_id, "cpu")  # (6, L): chosen rows, then rejected
    assert all(batch["vision"][b] is batch["vision"][b + 3] for b in range(3))
    rows = load_rows(vlm_data["prefs_trl"])
    for b, it in enumerate(items):  # hand check of the loss mask
        for r, key in ((b, "chosen"), (b + 3, "rejected")):
            ids, mask = batch["input_ids"][r], batch["loss_mask"][r]
            assert live.tok.decode(ids[mask.bool()]) == rows[b][key][0]["content"] + "<|im_end|>"
    counter = EncoderCounter(live.reference)
    try:
        ref = live.reference_sums(items, batch, "train")
    finally:
        counter.close()
    assert counter.calls == 1 and counter.images == 3  # one encoding per pair, not per row
    own = torch.tensor([_own_sequence_logps(live.reference, batch, r) for r in range(6)])
    torch.testing.assert_close(ref.float(), own, atol=1e-4, rtol=0)
    torch.testing.assert_close(cached.reference_sums(items, batch, "train").float(), own, atol=1e-4, rtol=0)


BAD_PREFERENCE_CASES = [
    ("bytes", "row 1: field 'images[0]': unreadable image"),
    ("count", "row 1: field 'prompt': the prompt has 2 image placeholder(s)"),
    ("text_model", "the row has images but the model has no image processor"),
]
"""(case, the refusal's message) of bad_preference_rows, shared by the DPO and RM tests."""


def bad_preference_rows(case: str, vlm_data, tmp_path, tiny_model_dir) -> tuple[str, str]:
    """(model folder, preference parquet) whose row 1 is broken as `case` says: unreadable image
    bytes, one placeholder too many, or image rows for a text-only model."""
    good = load_rows(vlm_data["prefs_verl"])[0]
    bad = {"bytes": {**good, "images": [{"bytes": b"GIF89a, not really", "path": None}]},
           "count": {**good, "prompt": [{"role": "user", "content": "<image><image>" + QUESTION}]},
           "text_model": good}[case]
    train = write_rows([good, bad, good, good], str(tmp_path / "prefs.parquet"))
    return (tiny_model_dir if case == "text_model" else vlm_data["model"]), train


@pytest.mark.parametrize("case,message", BAD_PREFERENCE_CASES)
def test_dpo_refuses_bad_image_rows_before_a_model_loads(case, message, vlm_data, tmp_path, tiny_model_dir,
                                                         no_model_loads):
    from reinforge.trainers.dpo import DPOTrainer

    model, train = bad_preference_rows(case, vlm_data, tmp_path, tiny_model_dir)
    with pytest.raises((DataError, ConfigError), match=re.escape(message)) as err:
        DPOTrainer(_dpo_cfg(model, train, tmp_path / "run"))
    assert "\n" not in str(err.value)

