"""A group of Ray actors, one per data-parallel rank, that the trainer uses like one worker.

`RayWorkerGroup` starts the ranks (one GPU each, or one CPU each on a CPU-only cluster),
rendezvouses them into one torch.distributed group and builds the workers and the generation
engine inside each rank. The proxies in proxies.py give the trainer the usual
`generate / log_probs / update / values` interface.

A rank that dies (killed, out of memory, node lost) fails the call with `WorkerDiedError`:
the survivors would otherwise wait in a collective until its timeout, so the whole group is
torn down and the run stops; `reinforge train ... --resume` continues from the last checkpoint.
"""
from __future__ import annotations

from reinforge.distributed.errors import WorkerDiedError  # noqa: F401  (re-exported)
from reinforge.distributed.rank import RankProcess


def world_size(cfg) -> int:
    return cfg.trainer.nnodes * cfg.trainer.devices_per_node


class RayWorkerGroup:
    def __init__(self, plan, builder, make_engine=None, *, threads_per_rank: int = 1):
        """`plan`: the run's RunPlan (trainers/plan.py), handed to every rank, which builds its
        workers from it with `builder(plan, shard=...)` and its engine with `make_engine`."""
        import ray

        from reinforge.config.load import ConfigError

        self.world = world_size(plan.cfg)
        self.sp = plan.cfg.trainer.sequence_parallel  # ranks per sequence-parallel group (same rows)
        self.dp = self.world // self.sp  # data-parallel groups: distinct rows
        batch = plan.batch_size
        sizes = {"data.train_batch_size * rollout.n": batch, "actor mini-batch": plan.actor_mini_batch_size}
        if plan.critic_enabled:
            sizes["critic mini-batch"] = plan.critic_mini_batch_size
        for name, n in sizes.items():
            if n % self.dp:
                raise ConfigError(f"trainer.backend=ray with {self.dp} data-parallel groups (nnodes * devices_per_node"
                                  f" / trainer.sequence_parallel): the {name} of {n} sequences must be divisible "
                                  f"by {self.dp}")
        if not ray.is_initialized():
            ray.init()  # joins a running cluster (ray start --head / --address) or starts a local one
        gpu = str(plan.device).startswith("cuda")
        opts = {"num_cpus": 1, "num_gpus": 1} if gpu else {"num_cpus": threads_per_rank}
        remote = ray.remote(RankProcess)
        self.ranks = [remote.options(**opts).remote(r, self.world) for r in range(self.world)]
        addr, port = self.get([self.ranks[0].address.remote()])[0]
        self.get([w.setup.remote(plan, builder, make_engine, addr, port, threads_per_rank) for w in self.ranks])

    def get(self, refs: list) -> list:
        """ray.get that fails fast: the first error (not the first ref in order) stops the group."""
        import ray

        pending, done = list(refs), {}
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                try:
                    done[ref] = ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    self._died(refs.index(ref), e)
                except ray.exceptions.RayTaskError as e:
                    # A survivor's collective often fails (connection reset) before Ray reports
                    # the dead peer: look for a dead rank among the others before blaming this one.
                    dead = self._dead_rank(pending)
                    if dead is not None:
                        self._died(refs.index(dead[0]), dead[1])
                    self.shutdown()  # the other ranks may be blocked in a collective with it
                    raise e.as_instanceof_cause() from None
        return [done[r] for r in refs]

    def _dead_rank(self, pending: list, timeout_s: float = 10.0):
        """(ref, error) of a pending call whose rank died, or None."""
        import ray

        ready, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout_s)
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as e:
                return ref, e
            except ray.exceptions.RayTaskError:
                continue
        return None

    def _died(self, rank: int, error: Exception):
        self.shutdown()
        raise WorkerDiedError(
            f"rank {rank} of {self.world} in the Ray worker group died ({type(error).__name__}); the run "
            f"stops. Resume from the last checkpoint with `reinforge train ... --resume`.") from error

    def run_split(self, role: str, method: str, batch, **kwargs):
        """Data-parallel inference: each data-parallel group gets an equal number of rows with
        about equal tokens (every rank of a sequence-parallel group the same rows: each computes
        a slice of their positions, and each returns the whole rows' results: the first rank's
        are kept); the per-row results come back in the batch's order."""
        from reinforge.models.packing import equal_count_partition, restore_order
        from reinforge.protocol import Batch

        if len(batch) % self.dp:
            raise ValueError(f"a batch of {len(batch)} sequences does not split over {self.dp} data-parallel groups")
        parts = equal_count_partition(batch["attention_mask"].sum(-1).tolist(), self.dp)
        refs = [[self.ranks[d * self.sp + j].run.remote(role, method, batch.index(p), kwargs) for j in range(self.sp)]
                for d, p in enumerate(parts)]
        outs = [group[0] for group in self._get_groups(refs)]
        order = [i for p in parts for i in p]
        out = Batch.concat(outs)
        return Batch({k: restore_order(v, order) for k, v in out.tensors.items()}, meta=out.meta)

    def _get_groups(self, refs: list[list]) -> list[list]:
        """`get` of every rank's call, grouped as `refs` is."""
        flat = self.get([r for group in refs for r in group])
        return [flat[i * self.sp:(i + 1) * self.sp] for i in range(len(refs))]

    def generate(self, prompts, kwargs: dict, seed: int | None, version: int):
        """Each rank generates a contiguous share of the prompts (all n samples of a prompt on one
        rank, so groups stay whole; shares differ by one prompt at most, a rank may have none);
        the rows come back in the prompts' order."""
        from reinforge.distributed.engine import merge_shares

        bounds = [len(prompts) * r // self.world for r in range(self.world + 1)]
        parts = [prompts.index(range(a, b)) if b > a else None for a, b in zip(bounds, bounds[1:])]
        outs = self.get([w.generate.remote(p, kwargs, seed, version) for w, p in zip(self.ranks, parts)])
        shares = [(o, b - a) for o, a, b in zip(outs, bounds, bounds[1:]) if o is not None]
        return merge_shares([o for o, _ in shares], [m for _, m in shares], kwargs.get("n", 1))

    def run_same(self, role: str, method: str, batch, **kwargs) -> list:
        """Every rank runs the worker method on the whole `batch` (put in the object store once)."""
        import ray

        ref = ray.put(batch)
        return self.get([w.run.remote(role, method, ref, kwargs) for w in self.ranks])

    def run_all(self, role: str, method: str, *args, **kwargs) -> list:
        """Every rank gets the same arguments (put in the object store once)."""
        import ray

        refs = [ray.put(a) for a in args]
        return self.get([getattr(w, method).remote(role, *refs, **kwargs) for w in self.ranks])

    def pids(self) -> list[int]:
        return self.get([w.pid.remote() for w in self.ranks])

    def shutdown(self) -> None:
        import ray

        for w in getattr(self, "ranks", []):
            ray.kill(w, no_restart=True)
        self.ranks = []
