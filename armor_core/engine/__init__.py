"""The Ray engine: a local cluster (or an existing one), worker groups, and DataProto dispatch.

A ``WorkerGroup`` is N Ray actors of one worker class, placed together by a placement group, that
act as data-parallel ranks 0..N-1. The driver talks to the group, not to ranks:

- ``group.call("method", *args)`` runs the method on every rank and returns the list of results;
- ``group.dispatch("method", data, *args)`` splits a DataProto into N shares (balanced by valid
  tokens, see ``balanced_split``), runs the method on each rank with its share, and concatenates
  the returned DataProtos in the original row order; dict results (metrics) are averaged.

Rollout, actor and reference live in one worker class (``ActorWorker``), so generation and
training share weights without a transfer; a separate rollout group is a matter of another class.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

__all__ = ["WorkerGroup", "balanced_split", "init_ray"]


def init_ray(address: str | None, num_cpus: int | None, needed_cpus: float) -> None:
    """Join ``address`` or start a local cluster with enough logical CPUs for every worker."""
    import ray

    if ray.is_initialized():
        return
    env = {"env_vars": {"TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore", "TRANSFORMERS_VERBOSITY": "error",
                        "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}}
    if address:
        ray.init(address=address, runtime_env=env, log_to_driver=True)
        return
    cpus = num_cpus or max(os.cpu_count() or 1, int(np.ceil(needed_cpus)))
    ray.init(num_cpus=cpus, include_dashboard=False, runtime_env=env, log_to_driver=True, configure_logging=False)


def balanced_split(token_counts: np.ndarray, n: int) -> list[np.ndarray]:
    """Split row indices into ``n`` groups of equal row count with token totals as even as possible.

    Rows are taken longest first and each goes to the lightest group that still has room (LPT
    scheduling), so each rank does about the same work; every group has len(rows)/n rows, because
    the gradient contract sums per-rank losses and DDP needs the same number of micro-batches.
    """
    rows = len(token_counts)
    if rows % n:
        raise ValueError(f"cannot split {rows} rows evenly over {n} workers; make the batch a multiple of the worker count")
    cap = rows // n
    loads = np.zeros(n)
    groups: list[list[int]] = [[] for _ in range(n)]
    for i in np.argsort(-token_counts, kind="stable"):
        open_groups = [g for g in range(n) if len(groups[g]) < cap]
        g = min(open_groups, key=lambda k: loads[k])
        groups[g].append(int(i))
        loads[g] += token_counts[i]
    return [np.sort(np.array(g, dtype=np.int64)) for g in groups]


class WorkerGroup:
    """N Ray actors of ``worker_cls`` acting as data-parallel ranks."""

    def __init__(self, worker_cls: type, n: int, *, cpus_per_worker: float, gpus_per_worker: float, name: str, init_kwargs: dict[str, Any],
                 rank_kwargs: list[dict[str, Any]] | None = None) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.n, self.name = n, name
        bundle = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
        self.pg = placement_group([bundle] * n, strategy="PACK")
        ray.get(self.pg.ready(), timeout=120)
        env = {}
        if n > 1:
            env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
        remote_cls = ray.remote(worker_cls)
        self.workers = []
        for rank in range(n):
            opts = dict(num_cpus=cpus_per_worker, num_gpus=gpus_per_worker, name=f"armor-{name}-{rank}-{os.getpid()}",
                        scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=rank),
                        runtime_env={"env_vars": {**env, "OMP_NUM_THREADS": str(max(1, int(cpus_per_worker)))}})
            per_rank = rank_kwargs[rank] if rank_kwargs else {}
            self.workers.append(remote_cls.options(**opts).remote(**init_kwargs, **per_rank, rank=rank, world_size=n))
        # surface construction errors (bad model path, ...) now, naming the worker
        self.call("ping")

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        import ray

        refs = [getattr(w, method).remote(*args, **kwargs) for w in self.workers]
        try:
            return ray.get(refs)
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(f"worker group '{self.name}' lost a worker during {method}: {e}") from e

    def dispatch(self, method: str, data: Any, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` with each rank's share of ``data``; gather results in the original order."""
        import ray

        from armor_core.protocol import DataProto

        if self.n == 1:
            return self.call(method, data, *args, **kwargs)[0]
        mask = data["response_mask"] if "response_mask" in data else data["attention_mask"]
        parts = balanced_split(mask.sum(-1).numpy(), self.n)
        refs = [getattr(w, method).remote(data[idx], *args, **kwargs) for w, idx in zip(self.workers, parts)]
        outs = ray.get(refs)
        if isinstance(outs[0], DataProto):
            merged = DataProto.concat(outs)
            inverse = np.argsort(np.concatenate(parts))
            return merged[inverse]
        if isinstance(outs[0], dict):
            keys = set().union(*outs)
            return {k: float(np.mean([o[k] for o in outs if k in o])) for k in keys}
        return outs

    def shutdown(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for w in self.workers:
            ray.kill(w)
        remove_placement_group(self.pg)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
