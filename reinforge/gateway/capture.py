"""Exact token capture at the gateway and the trajectories rebuilt from it (pure functions).

Every model call the gateway answers is recorded as a `Call`: the prompt ids it rendered, the ids
it sampled with their log-probs, and the weight version that sampled them. A rollout's calls
are rebuilt into trainable sequences by token-id prefixes only (no text is ever re-encoded):

- call k+1 *extends* call k when its prompt ids start with call k's prompt ids followed by call
  k's sampled ids; the ids between (tool results, user turns, chat-template headers: what the
  harness added) join the sequence with mask 0, call k+1's sampled ids with mask 1;
- a call extends the recorded call whose prompt + sampled ids is its longest such prefix (its
  *parent*); a call with no parent starts a new sequence: the harness edited the history
  (dropped, rewrote or summarised an earlier turn), which is counted as `edited`;
- each call that no later call extends (a leaf) ends one sequence, walked back to its root: a
  rollout whose calls form one chain gives one sequence; two calls extending the same parent
  (a fork: n > 1 samples, a retried turn) or an edited history give several (`leaves` > 1).

What a rollout with several sequences becomes is the caller's rule (gateway/rollout.py:
rollout.agent_history = split | drop). Shapes: lists of ints / floats, no tensors.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Call:
    """One sampled completion (one choice of a request) as the gateway produced it."""

    prompt_ids: tuple[int, ...]
    """The ids the gateway rendered and the engine was fed."""
    sampled_ids: tuple[int, ...]
    """The ids the engine sampled, as sampled (EOS / stop-string tokens included)."""
    log_probs: tuple[float, ...]
    """Log-probability of each sampled id under the sampled distribution."""
    version: int = 0
    """The weight version that sampled them (the trainer's step at the gateway)."""
    finish: str = "stop"
    """stop (EOS or a stop string), length (max_tokens or the budget) or tool_calls."""

    def __post_init__(self):
        if len(self.sampled_ids) != len(self.log_probs):
            raise ValueError(f"{len(self.sampled_ids)} sampled ids but {len(self.log_probs)} log-probs")

    @property
    def full(self) -> tuple[int, ...]:
        return self.prompt_ids + self.sampled_ids


@dataclass
class Sequence:
    """One trainable sequence rebuilt from a chain of calls: the root call's prompt, then the
    response: every later id, sampled (mask 1) or added by the harness (mask 0)."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    """1 on sampled ids (trained), 0 on the harness's."""
    log_probs: list[float] = field(default_factory=list)
    """The sampled ids' log-probs (0.0 on the harness's)."""
    versions: list[int] = field(default_factory=list)
    """The version that sampled each id (-1 on the harness's)."""
    calls: list[int] = field(default_factory=list)
    """Indices (into the rollout's calls) of the chain, root first."""
    turn_ends: list[int] = field(default_factory=list)
    """Response index of each call's last sampled id (-1 for a call that sampled nothing)."""
    finish: str = "stop"
    """The last call's finish reason."""


@dataclass(frozen=True)
class Rebuilt:
    sequences: list[Sequence]
    """One per leaf, in the order of their last calls."""
    edited: int
    """Calls after the first that extend no earlier call (an edited history)."""
    forks: int
    """Extra sequences from calls extending the same parent."""


def is_prefix(prefix: tuple[int, ...], ids: tuple[int, ...]) -> bool:
    return len(prefix) <= len(ids) and ids[:len(prefix)] == prefix


def parents(calls: list[Call]) -> list[int | None]:
    """Each call's parent: the index of the earlier call whose prompt + sampled ids is the
    longest prefix of its prompt ids (the latest of equals), or None."""
    out: list[int | None] = []
    for k, c in enumerate(calls):
        best, best_len = None, -1
        for j in range(k):
            f = calls[j].full
            if len(f) >= best_len and is_prefix(f, c.prompt_ids):
                best, best_len = j, len(f)
        out.append(best)
    return out


def chain_sequence(calls: list[Call], chain: list[int]) -> Sequence:
    """The sequence of a chain of call indices (root first, each extending the one before)."""
    root = calls[chain[0]]
    seq = Sequence(list(root.prompt_ids), calls=list(chain))
    end = len(root.prompt_ids)  # ids of the full sequence consumed so far
    for k in chain:
        c = calls[k]
        harness = c.prompt_ids[end:]
        seq.response_ids += harness
        seq.mask += [0] * len(harness)
        seq.log_probs += [0.0] * len(harness)
        seq.versions += [-1] * len(harness)
        seq.response_ids += c.sampled_ids
        seq.mask += [1] * len(c.sampled_ids)
        seq.log_probs += c.log_probs
        seq.versions += [c.version] * len(c.sampled_ids)
        seq.turn_ends.append(len(seq.response_ids) - 1 if c.sampled_ids else -1)
        end = len(c.full)
    seq.finish = calls[chain[-1]].finish
    return seq


def rebuild(calls: list[Call]) -> Rebuilt:
    """A rollout's calls (in the order they were answered) -> its sequences (module doc)."""
    par = parents(calls)
    children: dict[int, int] = {}
    for p in par:
        if p is not None:
            children[p] = children.get(p, 0) + 1
    leaves = [k for k in range(len(calls)) if k not in children]
    seqs = []
    for leaf in leaves:
        chain, k = [], leaf
        while k is not None:
            chain.append(k)
            k = par[k]
        seqs.append(chain_sequence(calls, chain[::-1]))
    roots = sum(p is None for p in par)
    return Rebuilt(seqs, edited=max(roots - 1, 0), forks=sum(n - 1 for n in children.values()))
