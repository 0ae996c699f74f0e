"""Mixture-of-experts policies: their routers, routing recorded by the rollout and replayed by the
trainer (rollout routing replay, R3: https://arxiv.org/abs/2510.11370), and the router outputs the
load-balancing loss reads (algos/moe.py).

transformers 5.x writes the MoE block of Qwen3-MoE, Qwen2-MoE and Mixtral alike: a router module
(`block.gate`, class `*TopKRouter`) maps hidden states (N, H), N = b x L tokens in the forward's
order, to (router logits (N, E), gate weights (N, k), chosen experts (N, k)), and the `experts`
module runs each token through its k experts scaled by the gate weights. One forward hook on each
router therefore does everything here, without touching the model's code (so FSDP2, LoRA and
gradient checkpointing see the same modules):
- record (the lean rollout, workers/rollout/lean.py): each call's chosen experts are kept; the loop
  places them at their (row, position) in `routed_experts`.
- replay (the actor's old-log-prob pass and update): the chosen experts are replaced by the
  rollout's, and the gate weights recomputed as R3 does: the router's softmax probabilities
  gathered at the replayed experts, renormalised where the router renormalises its top-k
  (Qwen's `norm_topk_prob`, always for Mixtral), in the dtype the router returns. Positions the
  rollout never routed (each row's last sampled token, which no rollout forward read, and the padding after it)
  keep the router's own choice. With the rollout's own experts this is bit for bit the router's
  output, so the only difference replay makes is the choice of experts.
- capture (the update): the router logits (with their gradient) and the experts used, for the
  auxiliary loss and the expert-load metrics.

`routed_experts` (B, S, layers, k), S = P + T the batch's columns, layers the MoE layers only, in
the smallest integer dtype that holds the expert ids plus the `unrouted` marker (uint8 up to 254
experts, else int16): 8 layers x top-2 is 16 bytes a token.

The hooks read a `Routing` object attached to the model (`attach_routing`, once, by the actor
worker). Its mode is set by whoever runs a forward (`select`) and left until the next one, so a
backward that recomputes a checkpointed layer replays the same experts; each user clears it after
its last forward (`clear`). A deep copy of the model (the asynchronous producer's behaviour
policy) copies the hooks with their own Routing.
"""
from __future__ import annotations

import functools

import torch

MOE_TYPES = ("qwen3_moe", "qwen2_moe", "mixtral")
"""model_type values whose MoE blocks have the router described above."""


def is_moe_config(config: dict) -> bool:
    """Whether a config.json (as a dict, read without torch) is an MoE model this module drives."""
    return config.get("model_type") in MOE_TYPES


def routers(model) -> list[torch.nn.Module]:
    """The router modules of an MoE causal LM in layer order (looking through PEFT / FSDP wrappers)."""
    return [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")
            and hasattr(m, "top_k") and hasattr(m, "num_experts")]


def route_dtype(num_experts: int) -> torch.dtype:
    """The storage dtype of `routed_experts`: expert ids and the `unrouted` marker must fit."""
    return torch.uint8 if num_experts < 255 else torch.int16


def unrouted(dtype: torch.dtype) -> int:
    """The marker of a position the rollout did not route (the dtype's largest value)."""
    return torch.iinfo(dtype).max


class Routing:
    """What the router hooks do at the next forward; one per model (`attach_routing`)."""

    def __init__(self, routers_: list[torch.nn.Module], replay: bool):
        self.layers, self.replay_enabled = len(routers_), replay
        self.top_k, self.num_experts = routers_[0].top_k, routers_[0].num_experts
        self.dtype = route_dtype(self.num_experts)
        self.handles = [r.register_forward_hook(functools.partial(self._hook, i)) for i, r in enumerate(routers_)]
        self.mode: str | None = None       # None | "record" | "replay"
        self.capture = False
        self.routes: torch.Tensor | None = None  # replay: (b, S, layers, k)
        self.recorded: list[torch.Tensor] = []   # record: (N, k) per router call
        self.captured: list[tuple[torch.Tensor, torch.Tensor]] = []  # capture: (logits (N, E), experts (N, k))

    # ---- set by the forward's owner -------------------------------------------------------
    def select(self, mode: str | None, routes: torch.Tensor | None = None, capture: bool = False) -> None:
        """The next forwards' mode: None (the router's own choice), "record", or "replay" of
        `routes` (b, S, layers, k) for a forward of b rows of S tokens."""
        if mode == "replay" and (routes is None or routes.shape[2:] != (self.layers, self.top_k)):
            raise ValueError(f"routed_experts must be (b, S, {self.layers}, {self.top_k}), "
                             f"got {None if routes is None else tuple(routes.shape)}")
        self.mode, self.routes, self.capture = mode, routes, capture
        self.recorded, self.captured = [], []

    def clear(self) -> None:
        """Back to the router's own choice, nothing held."""
        self.select(None)

    def take_recorded(self, b: int, L: int) -> torch.Tensor:
        """The experts recorded by the last forward of b rows x L tokens -> (b, L, layers, k)."""
        if len(self.recorded) != self.layers:
            raise RuntimeError(f"expected {self.layers} router calls in the forward, saw {len(self.recorded)}")
        out = torch.stack(self.recorded).view(self.layers, b, L, self.top_k).permute(1, 2, 0, 3)
        self.recorded = []
        return out.to(self.dtype)

    def take_captured(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """-> (router logits per layer, experts used per layer) of the last forward; released here
        (a deep copy of the model must not meet tensors that hold a graph)."""
        got, self.captured = self.captured[-self.layers:], []
        return [g[0] for g in got], [g[1] for g in got]

    # ---- the hook ------------------------------------------------------------------------
    def _hook(self, layer: int, module, args, output):
        logits, weights, experts = output
        if self.mode == "record":
            self.recorded.append(experts.detach())
        elif self.mode == "replay":
            experts, weights = self._replayed(layer, module, logits, weights, experts)
        if self.capture:
            self.captured.append((logits, experts.detach()))
        return (logits, weights, experts) if self.mode == "replay" else None

    def _replayed(self, layer, module, logits, weights, experts):
        """The rollout's experts for this layer (the router's own where it routed nothing) and the
        gate weights at them: softmax(logits) gathered, renormalised as the router does."""
        r = self.routes[:, :, layer].reshape(-1, self.top_k)  # (N, k)
        if r.shape[0] != experts.shape[0]:
            raise RuntimeError(f"routing replay: the forward routes {experts.shape[0]} tokens, routed_experts "
                               f"holds {r.shape[0]} (b x S); the batch and the forward disagree")
        r = r.to(experts.device)
        known = (r[:, :1] != unrouted(self.dtype))  # (N, 1)
        chosen = torch.where(known, r.long(), experts)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        w = probs.gather(-1, chosen)
        if getattr(module, "norm_topk_prob", True):  # Mixtral's router always renormalises
            w = w / w.sum(dim=-1, keepdim=True)
        return chosen, w.to(weights.dtype)


def attach_routing(model, replay: bool) -> Routing | None:
    """Hooks on every router of `model` (None unless it is one of MOE_TYPES); idempotent (the same Routing).
    replay: the run replays the rollout's routing (actor.router_replay=rollout), which the
    rollout reads to know it must record."""
    found = routing_of(model)
    if found is not None:
        found.replay_enabled = replay
        return found
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    rs = routers(model)
    if getattr(getattr(inner, "config", None), "model_type", None) not in MOE_TYPES or not rs:
        return None  # another family's router may return something else: leave it alone
    routing = Routing(rs, replay)
    model._reinforge_routing = routing
    return routing


def routing_of(model) -> Routing | None:
    """The Routing attached to `model` (or to the model inside its PEFT wrapper), else None."""
    found = getattr(model, "_reinforge_routing", None)
    if found is None and hasattr(model, "get_base_model"):
        found = getattr(model.get_base_model(), "_reinforge_routing", None)
    return found


def select_for(model, batch, capture: bool = False) -> Routing | None:
    """Before a trainer forward of `batch`'s rows on `model`: replay its `routed_experts` when the
    run replays (a RuntimeError when the batch has none: the rollout recorded nothing), else the
    routers' own choice; capture: keep the router outputs (`take_captured`). -> the Routing, or
    None for a model without one (the reference, a dense policy)."""
    routing = routing_of(model)
    if routing is None:
        return None
    if routing.replay_enabled:
        if "routed_experts" not in batch:
            raise RuntimeError("actor.router_replay=rollout: the batch has no routed_experts (its rollout "
                               "recorded none: only the lean loop on the actor's routers records them)")
        routing.select("replay", batch["routed_experts"], capture)
    else:
        routing.select(None, capture=capture)
    return routing
