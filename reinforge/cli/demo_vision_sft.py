"""The visual demo's SFT stage: supervised answers on count_shapes pictures, stopped by a
held-out rule (`reinforge demo --task count_shapes`, cli/demo_vision.py).

The demo runs its own loop rather than the SFT trainer (trainers/sft.py), which trains on image
rows too but has no hook to stop on a held-out metric (a debt, docs/architecture.md). Settings
come from presets/demo_count_shapes_sft.yaml, read as an SFT config; the loop does the arithmetic
the trainer would do on these rows: cross-entropy of the response tokens (the digit and
`<|im_end|>`) given the prompt and its picture, token mean, AdamW, linear warmup then a
constant lr, grad-norm clip 1. Every prompt of the task has the same text and
every picture the same size, so all rows encode to the same length and no padding is needed.

The stop rule (why it exists: a tiny random-init VLM sits at chance for a while and then learns
the task within ~100 steps, at a step that varies by seed, so a fixed SFT length gives a base
anywhere from chance to 100%, benchmarks/studies/vlm_feasibility.py): every `check_every` steps
the first response position is scored on `dev` rows, both its greedy answer token (argmax) and
the mean probability of the answer's digit (what sampling at T=1 gets right), and SFT stops at
the first check whose accuracy reaches `stop_acc` and whose probability reaches `stop_prob`, or
at `max_steps`. The probability is there because at the onset the argmax runs ahead of the
probabilities: an argmax over five nearly equal ones can be right 41% of the time while the
answer gets 21% (chance), a base GRPO gained nothing from (docs/demo.md, "The visual demo").
The dev rows are RL prompts, never the held-out test prompts; the rule is deterministic for a
seed (fixed data order, fixed init, one thread).
"""
from __future__ import annotations

import io
import random
import time


def encode_rows(processor, rows: list[dict]):
    """count_shapes rows (veRL schema: one image, the prompt's text, a ground truth) -> the
    processor's batch (input_ids (N, P), pixel_values (N * patches, D), image_grid_thw (N, 3),
    mm_token_type_ids (N, P)) and the answers (N,) as ints."""
    import torch
    from PIL import Image

    from reinforge.models.vlm_inputs import render

    text = render(processor, [{"role": "user", "content": [{"type": "image"},
                                                           {"type": "text", "text": _question(rows[0])}]}])
    images = [Image.open(io.BytesIO(r["images"][0]["bytes"])).convert("RGB") for r in rows]
    enc = processor(text=[text] * len(rows), images=images, return_tensors="pt", padding=True)
    answers = torch.tensor([int(_truth(r)) for r in rows])
    return enc, answers


def _question(row: dict) -> str:
    from reinforge.data.images import IMAGE_PLACEHOLDER

    content = row["prompt"][0]["content"]
    return content.replace(IMAGE_PLACEHOLDER, "")


def _truth(row: dict) -> str:
    return row["reward_model"]["ground_truth"] if "reward_model" in row else row["ground_truth"]


def _rows_of(enc, idx):
    """The rows `idx` (K,) of a processor batch whose images all have the same patch count."""
    pv = enc["pixel_values"]
    per = pv.shape[0] // enc["input_ids"].shape[0]
    return {"input_ids": enc["input_ids"][idx], "attention_mask": enc["attention_mask"][idx],
            "pixel_values": pv.view(-1, per, pv.shape[-1])[idx].reshape(-1, pv.shape[-1]),
            "image_grid_thw": enc["image_grid_thw"][idx], "mm_token_type_ids": enc["mm_token_type_ids"][idx]}


def dev_scores(model, enc, answers, digit_ids, chunk: int = 100) -> tuple[float, float]:
    """(share of rows whose greedy first response token is the answer's digit, mean probability
    of that digit at the first response position) over the rows of `enc`, answers (N,)."""
    import torch

    was_training = model.training
    model.eval()
    correct, prob = 0, 0.0
    with torch.no_grad():
        for s in range(0, len(answers), chunk):
            idx = torch.arange(s, min(s + chunk, len(answers)))
            logits = model(**_rows_of(enc, idx)).logits[:, -1].float()  # (k, V)
            target = digit_ids[answers[idx]]  # (k,)
            correct += int((logits.argmax(-1) == target).sum())
            prob += float(logits.softmax(-1).gather(-1, target[:, None]).sum())
    model.train(was_training)
    n = max(len(answers), 1)
    return correct / n, prob / n


def greedy_accuracy(model, enc, answers, digit_ids, chunk: int = 100) -> float:
    """Share of rows whose greedy first response token is the answer's digit."""
    return dev_scores(model, enc, answers, digit_ids, chunk)[0]


def run_vision_sft(model, processor, train_rows: list[dict], dev_rows: list[dict], *, lr: float, warmup_steps: int,
                   batch_size: int, max_steps: int, check_every: int, stop_acc: float, seed: int,
                   stop_prob: float = 0.0, log=print) -> dict:
    """SFT of `model` on `train_rows` (AdamW at `lr` after a linear warmup, `batch_size` rows a
    step drawn by a Random(seed)) until the stop rule (module docstring; stop_acc 0: run
    max_steps); returns {"steps", "dev_acc", "dev_prob", "history": [{"step", "loss", "dev_acc",
    "dev_prob"}]}."""
    import torch

    tok = processor.tokenizer
    digit_ids = torch.tensor([tok.convert_tokens_to_ids(str(d)) for d in range(10)])
    enc, answers = encode_rows(processor, train_rows)
    dev_enc, dev_answers = encode_rows(processor, dev_rows)
    P = enc["input_ids"].shape[1]
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    history, acc, prob, step, t0 = [], 0.0, 0.0, 0, time.perf_counter()
    model.train()
    while step < max_steps:
        step += 1
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, step / max(warmup_steps, 1))
        idx = torch.tensor(rng.sample(range(len(answers)), min(batch_size, len(answers))))
        batch = _rows_of(enc, idx)
        resp = torch.stack([digit_ids[answers[idx]], torch.full((len(idx),), tok.eos_token_id)], 1)  # (K, 2)
        ids = torch.cat([batch["input_ids"], resp], 1)
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=batch["pixel_values"],
                    image_grid_thw=batch["image_grid_thw"],
                    mm_token_type_ids=torch.cat([batch["mm_token_type_ids"], torch.zeros_like(resp)], 1))
        logp = torch.log_softmax(out.logits[:, P - 1:-1].float(), -1).gather(-1, resp.unsqueeze(-1))
        loss = -logp.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % check_every == 0 or step == max_steps:
            acc, prob = dev_scores(model, dev_enc, dev_answers, digit_ids)
            history.append({"step": step, "loss": loss.item(), "dev_acc": acc, "dev_prob": prob})
            log(f"sft step {step}: loss {loss.item():.3f}, dev greedy {acc:.3f}, p(answer) {prob:.3f} "
                f"({time.perf_counter() - t0:.0f} s)")
            if stop_acc > 0 and acc >= stop_acc and prob >= stop_prob:
                break
    return {"steps": step, "dev_acc": acc, "dev_prob": prob, "history": history}
