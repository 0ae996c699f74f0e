"""FSDP2 inside a worker's setup: shard a Hugging Face model over the data-parallel group, and
save / load each rank's shards of the model and optimizer (torch.distributed.checkpoint, which
reshards when the number of ranks changes). Full weights stream out one tensor at a time
(weights.py); `full_model_state` (rank 0 gets the whole state dict) is for tests.

Each decoder layer is its own FSDP unit (gathered just before it runs, freed after), the root
holds embeddings, final norm and head, and a vision-language model's vision tower: its encoder
runs inside the root's forward only for the prompts of a micro-batch not yet encoded (a frozen
tower's features are kept on the PromptImages, models/vlm_forward.py), a number of calls that
differs between ranks, so as FSDP units its blocks would all-gather a different number of
times on each rank and the ranks' collectives would not line up.
"""
from __future__ import annotations

import types

import torch
from torch import nn


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """Transformer blocks, found by class name so any HF decoder (Qwen2, Llama, ...) works;
    a vision tower's blocks excepted (module docstring); the outermost only (an MoE decoder
    layer holds a `*SparseMoeBlock`, whose parameters the layer's unit already shards)."""
    from reinforge.models.loading import vision_tower

    tower = vision_tower(model)
    inside = {id(m) for m in tower.modules()} if tower is not None else set()
    found: list[nn.Module] = []
    taken: set[int] = set()
    for m in model.modules():  # parents before children
        if id(m) in taken or id(m) in inside or not type(m).__name__.endswith(("DecoderLayer", "Block")):
            continue
        found.append(m)
        taken.update(id(c) for c in m.modules())
    return found


def shard_model(model: nn.Module) -> nn.Module:
    """Apply `fully_shard` per decoder layer, then to the root. Returns the same module.

    Also gives the root a `reinforge_call(fn, *args, **kwargs)` method registered as an FSDP
    forward method: fn runs between the root's pre- and post-forward hooks, so the root's own
    parameters (embeddings, final norm, LM head) are gathered for it and its outputs get the
    backward hooks, exactly as for `model(...)`. The fused log-prob path reads the LM head's
    weight directly and runs through it (`models.forward.as_root_forward`). In a sequence-parallel
    group (models/seq_parallel.py) the model's attention becomes the Ulysses one.
    """
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method

    from reinforge.models import seq_parallel
    from reinforge.models.tied_lookup import untie_lookup

    untie_lookup(model)  # FSDP reduces the gradients autograd gives it: the lookup's must be one of them
    seq_parallel.attach(model)  # the Ulysses attention, when the rank is in a sequence-parallel group
    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    model.reinforge_call = types.MethodType(_call, model)
    register_fsdp_forward_method(model, "reinforge_call")
    return model


def _call(self, fn, *args, **kwargs):
    return fn(*args, **kwargs)


def _options(**kw):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: every rank calls it; rank 0 gets the full CPU state dict, others {}."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(cpu_offload=True))


def save_sharded(model: nn.Module, opt: torch.optim.Optimizer, path: str) -> None:
    """Collective: every rank writes its own shards of the model and optimizer state under
    `path` (torch.distributed.checkpoint); no rank ever holds the full state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)


def load_sharded(model: nn.Module, opt: torch.optim.Optimizer, path: str) -> None:
    """Collective: each rank reads the shards it owns (resharding if the world size changed)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, opt)  # the layout to fill (initialises optimizer state)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
