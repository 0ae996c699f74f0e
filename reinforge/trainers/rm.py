"""Reward-model training (`reinforge rm`): Bradley-Terry on preference pairs.

    r(x, y) = w . h_last(x, y)            (a one-label sequence-classification head)
    loss    = -log sigma(r(x, y_c) - r(x, y_r))

The model is `<Arch>ForSequenceClassification` with num_labels=1, initialised from a causal-LM
folder (the backbone loads, the head is new) or from an earlier reward model. The score is read
at each sequence's last real token, found from the attention mask, never from pad ids (pad may
equal EOS). By default that token is the response's last one, not the EOS after it: the RL
reward scorer (reinforge.rewards.RewardModelScorer) scores decoded text, which has no EOS.
The export in run_dir/hf loads with `load_reward_model`, `load_critic` (critic init from an RM)
and as `reward.reward_model_path` of an RL run.

A vision-language model.path reads the pairs with its processor (TRL's vision preference rows,
`images` beside prompt/chosen/rejected, or veRL's `<image>` prompts: data/images.py) and trains
the VLM's backbone with a bias-free scalar head (models/vlm_critic.VisionValueModel, the VLM
critic's module): a pair's chosen and rejected rows share its prompt's PromptImages (one
encoding), the score is read as for text with the image features in the prompt's placeholders
and M-RoPE positions (models/reward_head.last_token_scores with `vision`), and the vision tower
is frozen unless model.freeze_vision_tower=false. The export (backbone, value_head.safetensors,
the image processor) loads with `load_reward_model` and as a VLM critic with the head kept; the
RL reward scorer reads decoded text without the images, so an RL run refuses it as
reward.reward_model_path (trainers/preflight.py).
"""
from __future__ import annotations

import torch

from reinforge.algos.preference import bradley_terry_loss
from reinforge.config.preference import RMConfig
from reinforge.models.loading import load_reward_model
from reinforge.models.reward_head import last_token_scores
from reinforge.seeding import seed_everything
from reinforge.trainers.preference_common import PairTrainer, load_inputs, pair_tensors


def load_rm_for_training(path: str, tokenizer, model_cfg, device: str):
    """A trainable one-label sequence classifier on the backbone at `path` (head new unless an RM;
    a VLM folder's: models/vlm_critic.VisionValueModel, its tower frozen by model.freeze_vision_tower)."""
    model = load_reward_model(path, dtype=model_cfg.dtype, device=device, trust_remote_code=model_cfg.trust_remote_code,
                              attn_implementation=model_cfg.attn_implementation,
                              gradient_checkpointing=model_cfg.gradient_checkpointing, train=True,
                              freeze_vision_tower=model_cfg.freeze_vision_tower)
    # HF's own pooling (used by other tools loading the export) needs the pad id to find the end.
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.classifier_dropout = 0.0
    return model


def sequence_rewards(model, batch: dict, score_eos: bool) -> torch.Tensor:
    """Scalar reward of each row: (2B, L) right-padded batch -> (2B,). Rows end with EOS (the
    dataset appends it); the score is read at the response's last token, the one before it,
    unless `score_eos` (models.reward_head.last_token_scores, which the RL scorer calls too).
    Image rows: batch["vision"], the (2B,) PromptImages (a pair's two rows share one)."""
    return last_token_scores(model, batch["input_ids"], batch["attention_mask"], skip_last=0 if score_eos else 1,
                             vision=batch.get("vision"))


class RMTrainer(PairTrainer):
    name = "rm"

    def __init__(self, cfg: RMConfig, train_dataset=None, eval_dataset=None):
        seed_everything(cfg.trainer.seed)  # before the model: the new score head is drawn at random
        # datasets: trainers/inputs.py; a VLM's pairs read with its processor (the export saves it)
        plan, tok, train, val, skipped, self.processor = load_inputs(cfg, train_dataset, eval_dataset)
        m = plan.cfg.model  # the resolved copy
        self.model = load_rm_for_training(m.path, tok, m, plan.device)
        self.setup(plan, tok, train, val, skipped)

    def export(self):
        # Recorded so that a scorer can read the score where it was trained (after EOS or not).
        self.model.config.reinforge_score_eos = bool(self.cfg.rm.score_eos)
        return super().export()

    def pair_loss(self, items: list[dict], split: str = "train"):
        B = len(items)
        r = sequence_rewards(self.model, pair_tensors(items, self.pad_id, self.device), self.cfg.rm.score_eos)  # (2B,)
        chosen, rejected = r[:B], r[B:]
        loss, bt = bradley_terry_loss(chosen, rejected)
        coef = self.cfg.rm.center_rewards_coef
        if coef:
            # Bradley-Terry fixes only differences; this keeps the scale's zero meaningful.
            loss = loss + coef * ((chosen + rejected) ** 2).mean()
        with torch.no_grad():
            metrics = {"rewards/chosen": chosen.mean(), "rewards/rejected": rejected.mean(),
                       "rewards/accuracies": bt["accuracy"], "rewards/margins": bt["margin"]}
        return loss, metrics
