"""Forward passes that every worker and trainer shares: response log-probs (+ entropy) and SFT
target log-probs, both through `token_logprobs` (the one model-to-log-prob path), and values.

Shapes: B sequences, L = P + T tokens (left-padded prompt, right-padded response), H hidden,
V vocabulary. Position ids always come from the attention mask, so RoPE sees each token's true
position however much padding the batch has (seed 004): a response's log-probs do not depend
on its neighbours in the batch.

Vision-language models (models/vlm_forward.py): `vision`, the rows' PromptImages (or None),
switches the positions to M-RoPE's (3, B, L) (models/mrope.py) and hands the image features to
the model (`images`: encoded once per distinct prompt). Without it nothing changes.
"""
from __future__ import annotations

import torch

from reinforge.algos.logprobs import logprobs_and_entropy_from_logits, logprobs_from_logits
from reinforge.models import seq_parallel
from reinforge.models.checks import logit_transform


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, L) 0/1 mask -> (B, L) positions: 0 at the first real token, clamped to 0 on left pads."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def unwrap_peft(model):
    """The model inside a PEFT wrapper, or `model` itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _lm_parts(model):
    """(backbone, lm_head) of a causal LM, looking through a PEFT wrapper."""
    inner = unwrap_peft(model)
    return inner.base_model if hasattr(inner, "base_model") else inner.model, inner.get_output_embeddings()


def as_root_forward(model, fn, *args, **kwargs):
    """fn(*args, **kwargs), run as a forward of `model`'s root module when the model provides
    one (`reinforge_call`, given by distributed.fsdp.shard_model): under FSDP2 the root's own
    parameters, the LM head among them, are only gathered inside such a call."""
    call = getattr(model, "reinforge_call", None)
    return call(fn, *args, **kwargs) if call is not None else fn(*args, **kwargs)


def token_logprobs(model, fwd: dict, select, labels: torch.Tensor, *, temperature: float = 1.0,
                   with_entropy: bool = False, fused: bool = True, chunk_size: int | None = None,
                   top_k: int = 0, top_p: float = 1.0, images: list | None = None,
                   body=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (M,) of `labels` (M,) and entropies (M,) or None: the one model-to-log-prob
    path of every trainer. `fwd` are the model's inputs (input_ids, attention_mask,
    position_ids); `select` maps the model's (..., X) output (hidden states or logits) to the
    (M, X) rows that predict `labels`.

    fused: log-probs from the selected hidden states and the LM head's weight in chunks of
    `chunk_size` tokens (0/None: sized by a memory budget), so no (M, V) logits exist at once.
    Otherwise the model's own forward gives the logits (heads with a bias always go this way).
    The fused path applies the model's own logit soft-cap / scale (checks.logit_transform), which
    the model's forward applies to its logits.
    Both run as a root forward (`as_root_forward`), so FSDP gathers the head for them.
    Under sequence parallelism (models/seq_parallel.py) the model runs on this rank's slice of
    the rows and the head on the selected rows that slice holds; the (M,) results are every
    rank's, gathered in order.
    top_k / top_p: the rollout's sampling filter (algos.logprobs.sampling_filter_; 0 / 1: none).
    images: a VLM's PromptImages in the order of their image slots in fwd (fwd then holds
    `image_slots`, the placeholders that take their features, and M-RoPE position_ids:
    vlm_forward.image_inputs): encoded inside the root forward, once per distinct prompt.
    body: `body(backbone, **fwd)` -> the (M, H) hidden states that predict `labels`, in place of
    `select(backbone(**fwd).last_hidden_state)` (models/shared_prompt.py: two backbone calls); the
    fused path only.
    """
    backbone, head = _lm_parts(model)
    use_fused = fused and getattr(head, "bias", None) is None
    if body is not None and not use_fused:
        raise ValueError("token_logprobs: body= needs the fused head (model.fused_logprobs, an LM head without bias)")
    scale, softcap = logit_transform(unwrap_peft(model).config) if use_fused else (1.0, 0.0)
    if images and seq_parallel.size() > 1:
        raise ValueError("trainer.sequence_parallel > 1 does not take image prompts")

    def head_logprobs(rows: torch.Tensor, labels: torch.Tensor):
        """(M, H) hidden states (fused) or (M, V) logits -> log-probs (M,), entropies (M,) or None."""
        if use_fused:
            from reinforge.algos.fused_logprobs import bf16_head, fused_logprobs_from_hidden

            # Under bf16 autocast the head stays fp32 (h comes out bf16: cast it up), except for
            # large vocabularies (fused_logprobs.bf16_head: bf16 matmuls, fp32 softmax); with bf16
            # weights (model.dtype) h meets the head in bf16 and the chunks accumulate in fp32.
            md = torch.bfloat16 if bf16_head(head.weight.shape[0], head.weight.dtype, rows.device.type) else None
            with torch.autocast(rows.device.type, enabled=False):
                return fused_logprobs_from_hidden(rows.to(head.weight.dtype), head.weight, labels,
                                                  temperature=temperature, chunk_size=chunk_size,
                                                  return_entropy=with_entropy, top_k=top_k, top_p=top_p,
                                                  logit_scale=scale, logit_softcap=softcap, matmul_dtype=md)
        if with_entropy:  # one custom backward for both: one (M, V) gradient, not two
            return logprobs_and_entropy_from_logits(rows, labels, temperature, chunk_size or None, top_k, top_p)
        return logprobs_from_logits(rows, labels, temperature, chunk_size or None, top_k, top_p), None

    def run(**fwd):
        if images:  # features placed at fwd's image_slots only (vlm_forward.image_inputs)
            from reinforge.models.vlm_forward import image_embeds

            fwd = image_embeds(model, fwd, images)
        if use_fused:
            call = lambda **f: backbone(**f, use_cache=False).last_hidden_state  # noqa: E731  (b, L, H)
        else:
            call = lambda **f: model(**f, use_cache=False).logits  # noqa: E731  (b, L, V)
        if body is not None:  # shared prompts (not under sequence parallelism: response_logprobs)
            return head_logprobs(body(backbone, **fwd), labels)
        if seq_parallel.size() == 1:
            return head_logprobs(select(call(**fwd)), labels)
        # Sequence parallelism: this rank's rows of its slice, then every rank's, in order
        rows, route = seq_parallel.model_rows(call, fwd, select)  # (m_r, H or V)
        logp, ent = head_logprobs(rows, labels[route.positions[route.g.rank]])
        return route.gather(logp), (route.gather(ent) if ent is not None else None)

    return as_root_forward(model, run, **fwd)


def response_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int, *,
                      temperature: float = 1.0, with_entropy: bool = False, fused: bool = True,
                      chunk_size: int | None = None, top_k: int = 0,
                      top_p: float = 1.0, vision: list | None = None,
                      share_prompt: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the last `response_len` tokens of `input_ids` under `model`.

    input_ids, attention_mask: (B, L). Returns log_probs (B, T) and entropy (B, T) or None
    (see `token_logprobs` for the fused and logits paths). vision: a VLM's B PromptImages or
    None (module docstring). share_prompt: forward each distinct prompt once and the responses
    on its key/value cache where that applies (models/shared_prompt.py; text rows, fused head).
    """
    B, T = input_ids.shape[0], response_len
    fwd = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask))
    images = None
    if vision is not None and any(v is not None for v in vision):
        from reinforge.models.vlm_forward import image_inputs

        # A sampled image placeholder in a response is text, as the rollout fed it (its own
        # embedding, text positions): only the prompt's placeholders take image features.
        fwd["position_ids"], fwd["image_slots"], images = image_inputs(model, input_ids, attention_mask, vision)
    body = None
    if (share_prompt and images is None and fused and getattr(_lm_parts(model)[1], "bias", None) is None
            and seq_parallel.size() == 1):
        from reinforge.models.shared_prompt import prompt_sharing_hidden

        def body(backbone, **fwd):
            return prompt_sharing_hidden(backbone, T, **fwd)
    logp, ent = token_logprobs(model, fwd, lambda x: x[:, -T - 1:-1].reshape(B * T, x.shape[-1]),
                               input_ids[:, -T:].reshape(-1), temperature=temperature, with_entropy=with_entropy,
                               fused=fused, chunk_size=chunk_size, top_k=top_k, top_p=top_p, images=images,
                               body=body)
    return logp.view(B, T), (ent.view(B, T) if ent is not None else None)


def target_logprobs(model, batch: dict[str, torch.Tensor], chunk_size: int | None = None,
                    fused: bool = True, vision: list | None = None) -> torch.Tensor:
    """Log-probs (N,) of SFT's target tokens, N = loss_mask[:, 1:].sum(): token t+1 where
    loss_mask is 1, predicted from position t. batch: (B, L) input_ids, attention_mask (or a
    packed row's 4D mask), position_ids, loss_mask. Only the target positions go through the
    LM head (the fused path never builds their (N, V) logits either). vision: a VLM's
    PromptImages or None, one per row of a padded batch, or (packed rows: a 4D mask and
    batch["segment"] (B, L)) one per example in row then segment order; its positions
    (M-RoPE, each example's own) replace batch's position_ids."""
    target = batch["loss_mask"][:, 1:].bool()  # (B, L-1)
    fwd = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    images = None
    if vision is not None and any(v is not None for v in vision):
        # the prompts' placeholders only: a completion that spells `<|image_pad|>` is text
        if fwd["attention_mask"].dim() == 2:
            from reinforge.models.vlm_forward import image_inputs

            fwd["position_ids"], fwd["image_slots"], images = image_inputs(model, fwd["input_ids"],
                                                                           fwd["attention_mask"], vision)
        else:  # packed SFT rows: each example's positions computed on it alone, moved into its slots
            from reinforge.models.packing import packed_example_vision

            fwd["position_ids"], fwd["image_slots"], images = packed_example_vision(model, fwd["input_ids"],
                                                                                    batch["segment"], vision)
    return token_logprobs(model, fwd, lambda x: x[:, :-1][target], batch["input_ids"][:, 1:][target],
                          fused=fused, chunk_size=chunk_size, images=images)[0]


def response_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int,
                    vision: list | None = None) -> torch.Tensor:
    """Values V(s_t) of the states before each response token: (B, L) -> (B, T).

    The value of the state that chooses token t is read at the position of token t-1, the same
    shift as the log-probs. vision: the rows' PromptImages (or None) for a vision-language
    critic (models/vlm_critic.py): the same image inputs as the actor's (`response_logprobs`),
    features in the prompts' placeholders only, M-RoPE positions.
    """
    T = response_len
    fwd = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask))
    if vision is None or all(v is None for v in vision):
        B = input_ids.shape[0]
        return value_rows(critic, fwd, lambda x: x[:, -T - 1:-1].reshape(B * T, x.shape[-1])).view(B, T)
    from reinforge.models.vlm_forward import image_embeds, image_inputs

    fwd["position_ids"], fwd["image_slots"], images = image_inputs(critic, input_ids, attention_mask, vision)

    def run(**fwd):  # the embedding and the tower read inside the root's forward (FSDP gathers them)
        return critic(**image_embeds(critic, fwd, images), use_cache=False).logits

    return as_root_forward(critic, run, **fwd)[:, -T - 1:-1, 0].float()


def value_rows(critic, fwd: dict, select) -> torch.Tensor:
    """The critic's values (M,) fp32 at the rows `select` picks from its (b, L, 1) output (the
    whole rows' forward, or under sequence parallelism each rank's slice and then every rank's
    rows in order: models/seq_parallel.py)."""
    call = lambda **f: critic(**f, use_cache=False).logits  # noqa: E731  (b, L, 1)
    if seq_parallel.size() == 1:
        return select(call(**fwd))[:, 0].float()
    rows, route = seq_parallel.model_rows(call, fwd, select)
    return route.gather(rows[:, 0].float())
