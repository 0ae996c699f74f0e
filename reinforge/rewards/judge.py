"""A generative reward model (LLM-as-judge): a causal LM reads a prompt template filled with the
prompt, the response and the ground truth, and its verdict is the score.

The reward.functions entry `judge` is this scorer (reward.judge configures it), called once a
batch like any batched reward function, so its weight, metrics (reward/judge/mean) and timeout
are the manager's. Two ways to read the verdict (reward.judge.mode):
- prob (default): P(yes) / (P(yes) + P(no)) over the judge's next token after the prompt, with
  yes/no the first tokens of reward.judge.verdicts; exact, no sampling. It equals
  sigmoid(logit_yes - logit_no); reward/judge/verdict_mass (P(yes) + P(no)) says how much of the
  judge's probability lands on the two verdicts at all.
- generate: a greedy generation; the first number in it, divided by score_scale and clipped to
  [0, 1] (0 when there is none; reward/judge/parsed is the fraction that held one).
Like RewardModelScorer, it reads text with its own tokenizer, batches with explicit position ids
(so a score does not depend on its batch's padding) and never trains.
"""
from __future__ import annotations

import re
import string

import torch

from reinforge.config.schema import DEFAULT_JUDGE_TEMPLATES, JudgeConfig
from reinforge.models.forward import position_ids_from_mask
from reinforge.models.loading import turn_end_ids
from reinforge.models.padding import pad

JUDGE_NAME = "judge"  # the reserved reward.functions name
JUDGE_MODES = ("prob", "generate")
PLACEHOLDERS = ("prompt", "response", "ground_truth")
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def check_template(template: str) -> None:
    """ValueError unless every placeholder of `template` is one of PLACEHOLDERS and {response}
    is among them ("" is the built-in template: valid)."""
    if not template:
        return
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ValueError(f"{exc} (write {{{{ and }}}} for literal braces)") from None
    known = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
    for f in fields:
        if f not in PLACEHOLDERS:
            shown = "{" + f + "}" if f else "{} (a positional placeholder)"
            raise ValueError(f"unknown placeholder {shown}; use {known} ({{{{ and }}}} for literal braces)")
    if "response" not in fields:
        raise ValueError(f"no {{response}} placeholder: the judge would never see the response (use {known})")


def fill_template(template: str, prompt: str, response: str, ground_truth) -> str:
    """The judge's text for one sample (a None ground truth reads as "")."""
    return template.format(prompt=prompt, response=response, ground_truth="" if ground_truth is None else ground_truth)


def parse_score(text: str, scale: float) -> tuple[float, bool]:
    """(score, parsed): the first number in `text` / scale, clipped to [0, 1]; (0.0, False) when none."""
    m = _NUMBER.search(text)
    if m is None:
        return 0.0, False
    return min(1.0, max(0.0, float(m.group()) / scale)), True


class JudgeScorer:
    """`judge(prompts, responses, ground_truths, extras) -> [{"score": s in [0, 1], ...}]`, a
    batched reward function (reinforge style) backed by the causal LM at cfg.model_path."""

    batched = True

    def __init__(self, cfg: JudgeConfig, device: str | torch.device = "cpu", dtype: str = "auto"):
        from reinforge.models.loading import load_causal_lm, load_tokenizer

        check_template(cfg.template)
        self.__name__ = JUDGE_NAME  # the manager names the function by it: reward/judge/mean
        self.cfg = cfg
        self.template = cfg.template or DEFAULT_JUDGE_TEMPLATES[cfg.mode]
        self.tok = load_tokenizer(cfg.model_path)
        self.model = load_causal_lm(cfg.model_path, dtype=dtype, device=str(device), train=False)
        self.device = torch.device(device)
        self.use_chat = bool(cfg.chat_template and getattr(self.tok, "chat_template", None))
        new = cfg.max_new_tokens if cfg.mode == "generate" else 0
        self.max_length = cfg.max_length or (self.model.config.max_position_embeddings - new)
        # prob mode reads each verdict at its first token; two verdicts sharing it cannot be told apart.
        firsts = [self.tok(v, add_special_tokens=False)["input_ids"][:1] for v in cfg.verdicts]
        if cfg.mode == "prob" and (not all(firsts) or firsts[0] == firsts[1]):
            raise ValueError(f"reward.judge.verdicts={list(cfg.verdicts)!r} must start with two different tokens "
                             f"of the judge's tokenizer (first tokens: {firsts})")
        self.yes_id, self.no_id = (f[0] if f else None for f in firsts)

    def encode(self, prompts, responses, ground_truths) -> list[list[int]]:
        """Each sample's judge input ids, the last max_length tokens of the filled template."""
        texts = [fill_template(self.template, p, r, g) for p, r, g in zip(prompts, responses, ground_truths)]
        if self.use_chat:
            texts = [self.tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                                  add_generation_prompt=True) for t in texts]
        ids = self.tok(texts, add_special_tokens=not self.use_chat)["input_ids"]
        return [x[-self.max_length:] for x in ids]

    @torch.no_grad()
    def _prob(self, ids: list[list[int]]) -> list[dict]:
        input_ids, mask = pad(ids, self.tok.pad_token_id, side="left")  # every row's last real token at L - 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        logits = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                            logits_to_keep=1).logits[:, -1].float()  # (B, V) at each row's last real token
        logp = torch.log_softmax(logits, dim=-1)
        yes, no = logp[:, self.yes_id], logp[:, self.no_id]
        score = torch.sigmoid(yes - no)  # P(yes) / (P(yes) + P(no))
        mass = yes.exp() + no.exp()
        return [{"score": s, "verdict_mass": m} for s, m in zip(score.tolist(), mass.tolist())]

    @torch.no_grad()
    def _generate(self, ids: list[list[int]]) -> list[dict]:
        from transformers import GenerationConfig

        input_ids, mask = pad(ids, self.tok.pad_token_id, side="left")
        # Greedy; the folder's generation_config.json (sampling settings) is not read. The verdict
        # ends at EOS or at the chat template's end of turn (Qwen2's EOS is <|endoftext|>, its
        # turns end with <|im_end|>): stopping at EOS alone lets the parser read past the verdict.
        stops = sorted({t for t in (self.tok.eos_token_id, *turn_end_ids(self.tok)) if t is not None})
        gen = GenerationConfig(do_sample=False, max_new_tokens=self.cfg.max_new_tokens,
                               pad_token_id=self.tok.pad_token_id, eos_token_id=stops)
        out = self.model.generate(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                                  generation_config=gen)
        texts = self.tok.batch_decode(out[:, input_ids.shape[1]:], skip_special_tokens=True)
        parsed = [parse_score(t, self.cfg.score_scale) for t in texts]
        return [{"score": s, "parsed": float(ok)} for s, ok in parsed]

    def __call__(self, prompts, responses, ground_truths, extras=None) -> list[dict]:
        ids = self.encode(prompts, responses, ground_truths)
        run = self._prob if self.cfg.mode == "prob" else self._generate
        out: list[dict] = []
        for start in range(0, len(ids), self.cfg.batch_size):
            out.extend(run(ids[start:start + self.cfg.batch_size]))
        return out
