"""Rollout with vLLM (GPU), colocated in the trainer's process.

UNTESTED ON GPU in this repository's CI (no GPU there): written against vLLM's documented
offline API (`LLM`, `SamplingParams`, `LLM.generate` with token-id prompts, `LLM.apply_model`);
`scripts/gpu_vllm_check.py` exercises it on a GPU machine. Import is lazy: `vllm` is the
optional extra `pip install 'reinforge[vllm]'`.

- Sampling parameters come from the rollout config (n, temperature, top_p, top_k (0 -> -1: off),
  max tokens, EOS ids, ignore_eos); greedy validation uses temperature 0. The batch meta records
  temperature, top_k and top_p, so the trainer's log-probs use the same filtered distribution.
- `rollout_log_probs` (B, T): vLLM's log-prob of every sampled token, after temperature
  (`logprobs_mode="processed_logprobs"`), i.e. the same quantity the trainer recomputes.
- `sync_weights(actor_model)`: after every update the actor's weights (LoRA merged) are loaded
  into the engine's model in place (`apply_model(lambda m: m.load_weights(...))`); with
  `VLLM_ENABLE_V1_MULTIPROCESSING=0` the engine runs in this process, so no copy crosses
  processes.
- Truncated importance sampling (`tis_weights`): vLLM's kernels and sampling differ slightly
  from the trainer's forward, so the rollout policy is not exactly the policy the trainer
  evaluates. Each token's policy loss is weighted by min(exp(old_log_probs - rollout_log_probs),
  rollout.tis_cap) (https://fengyao.notion.site/off-policy-rl), and the gap is logged.
"""
from __future__ import annotations

import os

import torch

from reinforge.algos.masked import masked_mean
from reinforge.protocol import Batch
from reinforge.workers.rollout.hf import assemble_rollout, finish_masks, left_pad, sampling_meta, stop_token_ids


def tis_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor,
                cap: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(B, T) trainer and rollout log-probs -> per-token weights min(exp(old - rollout), cap) (B, T)
    (no gradient; 0 off the mask) and metrics of the gap."""
    m = mask.float()
    gap = (old_log_probs - rollout_log_probs).detach() * m  # (B, T)
    ratio = torch.exp(gap)
    w = torch.clamp(ratio, max=cap) * m
    return w, {"rollout_corr/logprob_gap_abs_mean": masked_mean(gap.abs(), m),
               "rollout_corr/logprob_gap_max": gap.abs().max(),
               "rollout_corr/tis_weight_mean": masked_mean(w, m),
               "rollout_corr/tis_clip_frac": masked_mean((ratio > cap).float(), m)}


def hf_state_items(model):
    """(name, tensor) pairs with Hugging Face names, LoRA merged, for vLLM's `load_weights`."""
    if hasattr(model, "merge_adapter"):  # PEFT: merge, read the base weights, unmerge
        model.merge_adapter()
        try:
            base = model.get_base_model()
            items = [(n.replace(".base_layer", ""), p.detach().clone()) for n, p in base.state_dict().items()
                     if "lora_" not in n]
        finally:
            model.unmerge_adapter()
        return items
    return [(n, p.detach()) for n, p in model.state_dict().items()]


class VLLMRollout:
    """Same contract as HFRollout.generate, plus `rollout_log_probs` and meta `tis_cap`."""

    def __init__(self, cfg, actor_model, tokenizer, **llm_kwargs):
        """`llm_kwargs` go to vLLM's LLM(...) (a Ray rank adds sleep mode and the external launcher)."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
        from vllm import LLM

        r = cfg.rollout
        self.tok, self.r = tokenizer, r
        self.P, self.T = cfg.data.max_prompt_length, r.max_response_length
        self.eos_ids = stop_token_ids(tokenizer, actor_model)
        dtype = next(actor_model.parameters()).dtype
        self.llm = LLM(model=cfg.model.path, tokenizer=cfg.model.tokenizer_path or cfg.model.path,
                       dtype=str(dtype).removeprefix("torch."), gpu_memory_utilization=r.gpu_memory_utilization,
                       max_model_len=self.P + self.T, seed=cfg.trainer.seed, enable_prefix_caching=True,
                       logprobs_mode="processed_logprobs", trust_remote_code=cfg.model.trust_remote_code, **llm_kwargs)
        self.sync_weights(actor_model)  # the actor may be a LoRA-wrapped or resumed model

    def sync_weights(self, actor_model) -> None:
        self.load_weights(hf_state_items(actor_model))

    def load_weights(self, items) -> None:
        """(Hugging Face name, tensor) pairs, any iterable (a Ray rank streams them from its shards)."""
        self.llm.apply_model(lambda model: model.load_weights(iter(items)))
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights

    def _params(self, n: int, temperature: float, greedy: bool, seed: int | None = None):
        from vllm import SamplingParams

        return SamplingParams(n=n, temperature=0.0 if greedy else temperature, top_p=1.0 if greedy else self.r.top_p,
                              top_k=-1 if greedy or not self.r.top_k else self.r.top_k, max_tokens=self.T,
                              stop_token_ids=[] if self.r.ignore_eos else self.eos_ids, ignore_eos=self.r.ignore_eos,
                              logprobs=0, detokenize=False, seed=seed)

    def generate(self, prompts: Batch, *, n: int, temperature: float = 1.0, greedy: bool = False,
                 seeds: list[int] | None = None) -> Batch:
        """`seeds`: one per prompt (its samples then do not depend on the rest of the batch)."""
        params = self._params(n, temperature, greedy) if seeds is None else \
            [self._params(n, temperature, greedy, s) for s in seeds]
        outs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts["prompt_ids"]], params,
                                 use_tqdm=False)
        B = len(outs) * n
        resp = torch.full((B, self.T), self.tok.pad_token_id, dtype=torch.long)
        rlp, lengths = torch.zeros(B, self.T), torch.zeros(B, dtype=torch.long)
        for i, out in enumerate(outs):
            for j, c in enumerate(out.outputs):  # n completions per prompt, interleaved like HFRollout
                row, ids = i * n + j, list(c.token_ids)[: self.T]
                resp[row, :len(ids)] = torch.as_tensor(ids, dtype=torch.long)
                rlp[row, :len(ids)] = torch.tensor([lp[t].logprob for lp, t in zip(c.logprobs, ids)])
                lengths[row] = max(len(ids), 1)
        response_mask, truncated = finish_masks(resp, self.eos_ids, lengths, self.r.ignore_eos)
        ids, mask = left_pad(prompts["prompt_ids"], self.P, self.tok.pad_token_id)
        return assemble_rollout(prompts, ids, mask, resp, response_mask, truncated, n,
                                {**sampling_meta(temperature, self.r.top_k, self.r.top_p, greedy), "tis_cap": self.r.tis_cap},
                                {"rollout_log_probs": rlp * response_mask})


