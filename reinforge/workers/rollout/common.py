"""What every rollout backend shares: the prompt padding, the masks at EOS, the sampling meta,
the stop tokens and the Batch a rollout returns (backends: lean.py, hf.py, vllm.py; the agent
loop, reinforge.agents.loop, builds the same Batch over episodes).

Shapes: B0 prompts, n samples each, B = B0 * n rows, P prompt (left-padded), T response
(right-padded).
"""
from __future__ import annotations

import torch

from reinforge.models.loading import turn_end_ids
from reinforge.models.padding import pad
from reinforge.protocol import Batch


def pad_prompts(prompt_ids: list[list[int]], P: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt token lists -> ids (B0, P) and mask (B0, P), left-padded to data.max_prompt_length."""
    for s in prompt_ids:
        if len(s) > P:
            raise ValueError(f"prompt of {len(s)} tokens exceeds data.max_prompt_length={P}")
    return pad(prompt_ids, pad_id, side="left", length=P)


def response_mask_from_eos(responses: torch.Tensor, eos_ids: list[int], lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) generated ids -> mask up to and including the first EOS, and `truncated` (B,) bool.

    `lengths` (B,) is how many tokens each row really generated (beyond is padding). A row with
    no EOS keeps all its generated tokens and is marked truncated.
    """
    B, T = responses.shape
    pos = torch.arange(T).expand(B, T)
    is_eos = torch.isin(responses, torch.as_tensor(eos_ids)) & (pos < lengths[:, None])
    has_eos = is_eos.any(-1)
    first = torch.where(has_eos, is_eos.float().argmax(-1), lengths - 1)  # index of the last kept token
    mask = (pos <= first[:, None]).long()
    return mask, ~has_eos


def finish_masks(responses: torch.Tensor, eos_ids: list[int], lengths: torch.Tensor,
                 ignore_eos: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`response_mask_from_eos`, or with ignore_eos (EOS was not a stop token, every row ran to
    T tokens) all T tokens kept and every row marked truncated."""
    if ignore_eos:
        return torch.ones_like(responses), torch.ones(len(responses), dtype=torch.bool)
    return response_mask_from_eos(responses, eos_ids, lengths)


def sampling_meta(temperature: float, top_k: int, top_p: float, greedy: bool) -> dict:
    """The batch meta every backend records: the distribution the log-probs are computed under
    (greedy batches are scored under the plain softmax)."""
    if greedy:
        return {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
    return {"temperature": temperature, "top_k": top_k, "top_p": top_p}


def stop_token_ids(tokenizer, model) -> list[int]:
    """The ids a response ends at, sorted: the tokenizer's EOS, the model's generation-config EOS
    id(s) and the chat template's end of turn (models/loading.turn_end_ids: Qwen2's eos is
    <|endoftext|> while its chat turns end with <|im_end|>, and a rollout must stop where the
    template ends a turn)."""
    return stop_tokens(tokenizer, getattr(getattr(model, "generation_config", None), "eos_token_id", None))


def stop_tokens(tokenizer, generation_eos) -> list[int]:
    """`stop_token_ids` from a generation config's eos_token_id (an int, a list or None)."""
    gen = [] if generation_eos is None else list(generation_eos) if isinstance(generation_eos, (list, tuple)) \
        else [generation_eos]
    return sorted({t for t in (tokenizer.eos_token_id, *gen, *turn_end_ids(tokenizer)) if t is not None})


def assemble_rollout(prompts: Batch, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, resp: torch.Tensor,
                     response_mask: torch.Tensor, truncated: torch.Tensor, n: int, meta: dict,
                     extra: dict | None = None) -> Batch:
    """The rollout Batch every backend returns: prompt_ids/prompt_mask (B0, P) left-padded, resp /
    response_mask (B, T) with B = B0 * n interleaved, truncated (B,); the per-prompt fields of
    `prompts` are repeated n times (`uid` becomes `group_ids`); `extra` (B, ...) tensors join."""
    rows = prompts.repeat(n)
    p_ids, p_mask = prompt_ids.repeat_interleave(n, 0), prompt_mask.repeat_interleave(n, 0)
    out = Batch({"prompts": p_ids, "responses": resp, "input_ids": torch.cat([p_ids, resp], dim=1),
                 "attention_mask": torch.cat([p_mask, response_mask], dim=1), "response_mask": response_mask,
                 "group_ids": rows["uid"], "truncated": truncated, **(extra or {})},
                dict(rows.non_tensors), meta)
    return out | rows.select([k for k in rows.tensors if k != "uid"])
