"""PPO with a critic on image prompts (a tiny Qwen2-VL; the value tests on Qwen2.5-VL too): the vision-language value model
(models/vlm_critic.py). Its values of a left-padded batch equal transformers' own unpadded
forward of each row (the model's own M-RoPE positions and image scatter), a placeholder sampled
in a response stays text as in the actor's forward, a saved critic reloads with its head, and
one PPO step (GAE) trains the critic's language model and head with both towers unchanged."""
from __future__ import annotations

import json
import math

import pytest
import torch
from PIL import Image

from reinforge.config.load import load_config
from reinforge.config.schema import RLConfig
from tests.test_vlm_train import _overrides, _params, vlm_setup  # noqa: F401 (a fixture)


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl"])
def critic_and_rows(request, tmp_path_factory):
    """A VLM critic of each family (its head re-drawn at std 1, so values are O(1) and 1e-5
    means something) and three rows: (prompt ids, PromptImages, response ids) of different
    prompt and image sizes."""
    from reinforge.models.loading import load_critic, load_vlm_processor
    from reinforge.models.vlm_inputs import encode_prompt
    from reinforge.models.vlm_tiny import make_tiny_vlm

    model = str(tmp_path_factory.mktemp("vlm_critic") / request.param)
    make_tiny_vlm(model, hidden_size=64, num_layers=2, seed=4, family=request.param)
    critic = load_critic(model, dtype="float32").eval()
    torch.nn.init.normal_(critic.score.weight, std=1.0)
    proc = load_vlm_processor(model)
    rows = []
    for i, (size, text) in enumerate([(56, "How many?"), (84, "Count the red shapes."), (56, "x")]):
        img = Image.new("RGB", (size, size), (40 * i, 200, 30))
        ids, vision = encode_prompt(proc, [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}],
                                    [img])
        gen = torch.Generator().manual_seed(i)
        resp = torch.randint(9, 100, (3 + 2 * i,), generator=gen).tolist()  # characters, no special ids
        rows.append((ids, vision, resp))
    return critic, rows, proc


def _padded(rows, pad_id: int):
    """Left-padded prompts, right-padded responses -> input_ids, attention_mask (B, P+T), T."""
    from reinforge.models.padding import pad

    p_ids, p_mask = pad([r[0] for r in rows], pad_id, side="left")
    r_ids, r_mask = pad([r[2] for r in rows], pad_id, side="right")
    return torch.cat([p_ids, r_ids], 1), torch.cat([p_mask, r_mask], 1), r_ids.shape[1]


def test_vlm_critic_values_equal_the_models_own_unpadded_forward(critic_and_rows):
    """Batched, left-padded values == each row alone through transformers' own forward
    (pixel_values, image_grid_thw, mm_token_type_ids: its get_rope_index positions), 1e-5."""
    from reinforge.models.forward import response_values
    from reinforge.models.vlm_inputs import image_token_type_ids

    critic, rows, proc = critic_and_rows
    ids, mask, T = _padded(rows, proc.tokenizer.pad_token_id)
    with torch.no_grad():
        values = response_values(critic, ids, mask, T, vision=[r[1] for r in rows])  # (B, T)
        for i, (p, v, r) in enumerate(rows):
            one = torch.tensor([p + r])
            hidden = critic.model(input_ids=one, pixel_values=v.pixel_values, image_grid_thw=v.image_grid_thw,
                                  mm_token_type_ids=image_token_type_ids(one, proc.image_token_id)).last_hidden_state
            own = critic.score(hidden)[0, len(p) - 1:-1, 0]  # the state before each response token
            assert values[i, :len(r)].abs().max() > 0.1  # O(1) values: the tolerance is meaningful
            assert torch.allclose(values[i, :len(r)], own, atol=1e-5), (values[i, :len(r)] - own).abs().max()


def test_vlm_critic_sampled_placeholder_is_text_and_reload_keeps_head(critic_and_rows, tmp_path):
    """A response token equal to <|image_pad|> takes no image feature (as the rollout fed it):
    the batched values equal the row's own unpadded values; a saved critic loads back with its
    value head (not a new one) and gives the same values."""
    from reinforge.models.loading import load_critic
    from reinforge.models.forward import response_values

    critic, rows, proc = critic_and_rows
    rows = [(p, v, r[:1] + [proc.image_token_id] + r[2:]) for p, v, r in rows]
    ids, mask, T = _padded(rows, proc.tokenizer.pad_token_id)
    with torch.no_grad():
        values = response_values(critic, ids, mask, T, vision=[r[1] for r in rows])
        for i, (p, v, r) in enumerate(rows):
            alone = response_values(critic, torch.tensor([p + r]), torch.ones(1, len(p + r), dtype=torch.long),
                                    len(r), vision=[v])[0]
            assert torch.allclose(values[i, :len(r)], alone, atol=1e-5)
        critic.save_pretrained(tmp_path / "critic")
        back = load_critic(str(tmp_path / "critic"), dtype="float32").eval()
        assert torch.equal(back.score.weight, critic.score.weight)
        assert torch.allclose(response_values(back, ids, mask, T, vision=[r[1] for r in rows]), values, atol=1e-6)
        fresh = load_critic(str(tmp_path / "critic"), dtype="float32", reinit_head=True)
        assert float(fresh.score.weight.std()) < 0.01  # reinit_head: the small new head


def test_ppo_step_on_image_prompts(vlm_setup, tmp_path):  # noqa: F811
    """One PPO step (GAE, critic from the actor's VLM folder, two mini-batches): finite losses,
    both vision towers unchanged, the actor's and the critic's language models and the value
    head trained; the checkpoint's critic resumes."""
    from reinforge.trainers.rl import RLTrainer

    model, verl_file, _ = vlm_setup
    cfg = load_config(RLConfig, "ppo", _overrides(model, verl_file, str(tmp_path / "run"), **{
        "rollout.n": 2, "actor.mini_batch_size": 2, "critic.mini_batch_size": 2, "critic.lr": 1e-2,
        "actor.micro_batch_size": 2, "critic.micro_batch_size": 2, "trainer.save_every": 1}))
    trainer = RLTrainer(cfg)
    critic_model = trainer.critic_model
    before = {name: (_params(m, True), _params(m, False)) for name, m in
              (("actor", trainer.actor_model), ("critic", critic_model))}
    assert before["critic"][0] and not any(p.requires_grad for n, p in critic_model.named_parameters() if "visual" in n)
    seen, values = {}, trainer.critic.values

    def record(batch):
        seen["batch"], seen["values"] = batch, values(batch)
        return seen["values"]

    trainer.critic.values = record
    trainer.fit()
    step = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()][-1]
    for key in ("actor/pg_loss", "critic/vf_loss", "critic/grad_norm", "critic/vf_explained_var"):
        assert math.isfinite(step[key]), key
    b = seen["batch"]
    assert "vision" in b and all(v is not None for v in b["vision"])
    for name, m in (("actor", trainer.actor_model), ("critic", critic_model)):
        tower, lm = before[name]
        after_tower, after_lm = _params(m, True), _params(m, False)
        assert all(torch.equal(tower[k], after_tower[k]) for k in tower), f"the {name}'s vision tower changed"
        changed = {k for k in lm if not torch.equal(lm[k], after_lm[k])}
        assert any("language_model" in k for k in changed), f"the {name}'s language model did not train"
        if name == "critic":
            assert "score.weight" in changed
    again = RLTrainer(cfg)  # the checkpoint's critic loads back into a fresh value model
    assert again.resume() == 1
    assert all(torch.equal(p, q) for p, q in zip(again.critic_model.parameters(), critic_model.parameters()))


@pytest.mark.parametrize("critic,match", [
    ("text", "critic.model_path=.*text model.*would not see the images"),
    ("patch", "critic.model_path=.*its patch_size=7 differs from model.path's 14"),
])
def test_a_critic_that_cannot_read_the_images_is_refused(vlm_setup, tiny_model_dir, tmp_path, no_model_loads,  # noqa: F811
                                                         critic, match):
    """A text critic, or a VLM critic cutting the actor's pixel patches differently, is refused
    before any model loads."""
    import shutil

    from reinforge.config.load import ConfigError
    from reinforge.trainers.plan import resolve

    model, verl_file, _ = vlm_setup
    path = tiny_model_dir
    if critic == "patch":
        path = str(shutil.copytree(model, tmp_path / "other_vlm"))
        conf = json.loads((tmp_path / "other_vlm" / "config.json").read_text())
        conf["vision_config"]["patch_size"] = 7
        (tmp_path / "other_vlm" / "config.json").write_text(json.dumps(conf))
    cfg = load_config(RLConfig, "ppo", _overrides(model, verl_file, str(tmp_path / "run"), **{"critic.model_path": path}))
    with pytest.raises(ConfigError, match=match) as err:
        resolve(cfg)
    assert "\n" not in str(err.value)
