"""On-policy distillation end to end on tiny models: `--config distill` with a teacher and a
student that starts as the teacher with perturbed weights.

The mechanism is checked inside real steps: the teacher's log-probs in the batch are the teacher
model's, the advantage is exactly minus the per-token reverse KL on response tokens (zero
elsewhere), and the exact reverse KL(student || teacher) over the whole vocabulary, on the first
step's batch, goes down over a few steps, for both teacher.mode=reverse_kl and gkd.
"""
import copy
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from reinforge.config.load import ConfigError, load_config
from reinforge.config.schema import RLConfig
from reinforge.models.forward import position_ids_from_mask, response_logprobs
from reinforge.trainers import stages
from reinforge.trainers.rl import RLTrainer
from tests.conftest import rl_overrides

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def student_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny teacher with N(0, 0.1^2) added to every weight, saved with the same tokenizer."""
    from reinforge.tasks import build_char_tokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    out = tmp_path_factory.mktemp("student")
    model.save_pretrained(out)
    build_char_tokenizer().save_pretrained(out)
    return str(out)


def exact_reverse_kl(student, teacher, batch) -> float:
    """Mean over response tokens of KL(student || teacher), summed over the vocabulary."""
    am, T = batch["attention_mask"], batch["responses"].shape[1]
    fwd = dict(input_ids=batch["input_ids"], attention_mask=am, position_ids=position_ids_from_mask(am))
    with torch.no_grad():
        log_q = student(**fwd).logits[:, -T - 1:-1].float().log_softmax(-1)
        log_p = teacher(**fwd).logits[:, -T - 1:-1].float().log_softmax(-1)
    kl = (log_q.exp() * (log_q - log_p)).sum(-1)  # (B, T)
    mask = batch["response_mask"].float()
    return float((kl * mask).sum() / mask.sum())


def _run(mode, student_dir, teacher_dir, data, run_dir, monkeypatch, steps):
    """A distill run of `steps` steps; -> (first step's batch, its advantages, the student before
    training, the trained student, the teacher model, metrics rows)."""
    seen = []
    real = stages.distill_advantages

    def record(batch, task_adv, t):
        adv, m = real(batch, task_adv, t)
        seen.append((batch, adv))
        return adv, m

    monkeypatch.setattr(stages, "distill_advantages", record)
    extra = {"teacher.path": teacher_dir, "teacher.mode": mode, "trainer.total_steps": steps, "trainer.val_every": 0,
             "trainer.val_before_train": False, "trainer.export_hf": False, "actor.lr": 3e-3, "data.val_files": "[]",
             "data.train_batch_size": 8}
    cfg = load_config(RLConfig, "distill", rl_overrides(student_dir, data, str(run_dir), **extra))
    trainer = RLTrainer(cfg)
    before = copy.deepcopy(trainer.actor_model).eval()
    trainer.fit()
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return seen[0][0], seen[0][1], before, trainer.actor_model.eval(), trainer.teacher.model, rows


def test_reverse_kl_distillation(student_dir, tiny_model_dir, arith_data, tmp_path, monkeypatch):
    batch, adv, before, after, teacher, rows = _run("reverse_kl", student_dir, tiny_model_dir, arith_data,
                                                    tmp_path / "rkl", monkeypatch, steps=4)
    mask = batch["response_mask"].bool()
    teacher_logp, _ = response_logprobs(teacher, batch["input_ids"], batch["attention_mask"], mask.shape[1])
    torch.testing.assert_close(batch["teacher_log_probs"][mask], teacher_logp[mask], rtol=1e-5, atol=1e-5)
    k = batch["old_log_probs"] - batch["teacher_log_probs"]
    assert torch.equal(adv[mask], -k[mask]) and torch.all(adv[~mask] == 0)
    step1 = next(r for r in rows if r["step"] == 1)
    assert step1["distill/reverse_kl"] == pytest.approx(float(k[mask].mean()), rel=1e-5)
    assert step1["actor/pg_clipfrac"] == 0.0  # on-policy: ratio 1
    kl0, kl1 = exact_reverse_kl(before, teacher, batch), exact_reverse_kl(after, teacher, batch)
    assert kl1 < 0.8 * kl0, (kl0, kl1)


def test_gkd_distillation(student_dir, tiny_model_dir, arith_data, tmp_path, monkeypatch):
    from reinforge.algos.distill import generalized_jsd

    batch, adv, before, after, teacher, rows = _run("gkd", student_dir, tiny_model_dir, arith_data,
                                                    tmp_path / "gkd", monkeypatch, steps=3)
    assert torch.all(adv == 0)  # task_reward_weight 0: the JSD loss is the only signal
    am, T, mask = batch["attention_mask"], batch["responses"].shape[1], batch["response_mask"].bool()
    fwd = dict(input_ids=batch["input_ids"], attention_mask=am, position_ids=position_ids_from_mask(am))
    with torch.no_grad():  # the first update's loss: token-mean JSD(0.5) at the rollout weights
        jsd = generalized_jsd(before(**fwd).logits[:, -T - 1:-1], teacher(**fwd).logits[:, -T - 1:-1], 0.5)
    assert next(r for r in rows if r["step"] == 1)["actor/gkd_loss"] == pytest.approx(float(jsd[mask].mean()), rel=1e-4)
    kl0, kl1 = exact_reverse_kl(before, teacher, batch), exact_reverse_kl(after, teacher, batch)
    assert kl1 < 0.8 * kl0, (kl0, kl1)


def test_distill_refusals(student_dir, tiny_model_dir, arith_data, tmp_path, no_model_loads):
    from reinforge.trainers.plan import resolve

    def cfg(**extra):
        return load_config(RLConfig, "distill", rl_overrides(student_dir, arith_data, str(tmp_path / "r"), **extra))

    with pytest.raises(ConfigError, match="teacher.path is required"):
        resolve(cfg())
    other = tmp_path / "other_tok"  # the teacher with two tokens' ids swapped in its tokenizer
    other.mkdir()
    for f in ("config.json", "model.safetensors"):
        (other / f).symlink_to(f"{tiny_model_dir}/{f}")
    tok = json.loads(open(f"{tiny_model_dir}/tokenizer.json").read())
    vocab = tok["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ConfigError, match="tokenizer differs from the student's"):
        resolve(cfg(**{"teacher.path": str(other)}))
    with pytest.raises(ConfigError, match="teacher.mode=gkd compares whole distributions: rollout.top_k"):
        resolve(cfg(**{"teacher.path": tiny_model_dir, "teacher.mode": "gkd", "rollout.top_k": 5}))
    with pytest.raises(ConfigError, match="trainer.backend=local only"):
        resolve(cfg(**{"teacher.path": tiny_model_dir, "trainer.backend": "ray"}))


def test_gkd_forward_matches_the_logits_path(student_dir, tiny_model_dir):
    """workers/gkd.py on a ragged batch: the student's log-probs and entropies equal the actor's
    usual path, the JSD equals generalized_jsd of both models' logits, and the gradient of a mix
    of the three reaches the student's weights as through the full logits."""
    from reinforge.algos.distill import generalized_jsd
    from reinforge.workers.gkd import GKDTerm, gkd_log_probs
    from tests.conftest import ragged_batch

    student = AutoModelForCausalLM.from_pretrained(student_dir)
    teacher = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval().requires_grad_(False)
    mb = ragged_batch(student.config.vocab_size, 4, 5, 6)
    T, temp, am = 6, 0.8, mb["attention_mask"]
    logp, ent, jsd = gkd_log_probs(student, GKDTerm(teacher, 0.3, 1.0), mb, temp, chunk_size=7)
    (logp.sum() + ent.sum() + 2 * jsd.sum()).backward()
    got = [p.grad.clone() for p in student.parameters()]
    student.zero_grad()

    fwd = dict(input_ids=mb["input_ids"], attention_mask=am, position_ids=position_ids_from_mask(am))
    zs = student(**fwd).logits[:, -T - 1:-1] / temp
    with torch.no_grad():
        zt = teacher(**fwd).logits[:, -T - 1:-1] / temp
    log_q = zs.log_softmax(-1)
    ref_logp = log_q.gather(-1, mb["responses"][..., None])[..., 0]
    ref_ent = -(log_q.exp() * log_q).sum(-1)
    ref_jsd = generalized_jsd(zs.reshape(-1, zs.shape[-1]), zt.reshape(-1, zt.shape[-1]), 0.3).view(4, T)
    for a, b in ((logp, ref_logp), (ent, ref_ent), (jsd, ref_jsd)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    (ref_logp.sum() + ref_ent.sum() + 2 * ref_jsd.sum()).backward()
    for g, p in zip(got, student.parameters()):
        scale = max(float(p.grad.abs().max()), 1e-12)
        assert float((g - p.grad).abs().max()) <= 1e-5 * scale
