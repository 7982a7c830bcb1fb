"""A reward model or local judge on a Ray worker of its own (``placement: worker``, see
``armor_core.rewards.placement``): the worker, the driver's client for it, and how the trainer starts them.

``RewardModelWorker`` takes the devices the ProcessIsolator planned for it, loads the entry's scorer there (on a
GPU when it was given one) and scores a batch per call. ``WorkerClient`` awaits each call at most
``reward.timeout_s`` and turns a timeout or a dead worker into ``RewardWorkerError``, naming the worker.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Mapping

from armor_core.rewards.placement import LocalScorer, RewardWorkerError, WorkerScorer
from armor_core.workers.api import RewardModelAPI

if TYPE_CHECKING:
    from armor_core.engine import WorkerGroup

__all__ = ["RewardModelWorker", "WorkerClient", "start_reward_workers"]


class RewardModelWorker:
    """The Ray actor: takes its planned devices, loads the scorer's model there, scores batches."""

    def __init__(
        self, scorer: LocalScorer, config: dict, rank: int = 0, world_size: int = 1, assignment: dict | None = None
    ) -> None:
        import torch

        from armor_core.config.schema import from_dict
        from armor_core.workers.common import isolate, quiet_transformers

        self.rank = rank
        self.isolation = isolate(assignment, from_dict(config), rank)  # before anything touches CUDA
        quiet_transformers()
        scorer.threads = torch.get_num_threads()  # the cores it was given, not the pool's setting
        if torch.cuda.is_available():  # the isolator left only this worker's GPUs visible
            scorer.device = "cuda"
        self.scorer, self.calls, self.rows = scorer, 0, 0
        model, _ = scorer.load()
        self.dtype = str(next(model.parameters()).dtype).removeprefix("torch.")

    def ping(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": os.getpid(), "device": self.scorer.device}

    def isolation_record(self) -> dict[str, Any]:
        return self.isolation

    def score(
        self, prompts: list[str], responses: list[str], ground_truths: list[Any], extras: list[dict[str, Any]]
    ) -> dict[str, Any]:
        t0 = time.perf_counter()
        results = self.scorer.score_batch(prompts, responses, ground_truths, extras)
        self.calls, self.rows = self.calls + 1, self.rows + len(prompts)
        return {"results": list(results), "pid": os.getpid(), "seconds": time.perf_counter() - t0}

    def stats(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "device": self.scorer.device,
            "dtype": self.dtype,
            "calls": self.calls,
            "rows": self.rows,
        }


class WorkerClient:
    """The driver's handle on one started worker group: a batch per call, awaited at most ``timeout_s``."""

    def __init__(self, group: WorkerGroup, timeout_s: float) -> None:
        self.group, self.timeout_s = group, float(timeout_s)

    def score(
        self, prompts: list[str], responses: list[str], ground_truths: list[Any], extras: list[dict[str, Any]]
    ) -> dict[str, Any]:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        from armor_core.engine import death_cause

        ref = self.group.call_rank(0, RewardModelAPI.score, prompts, responses, ground_truths, extras)
        try:
            return ray.get(ref, timeout=self.timeout_s)
        except GetTimeoutError:
            try:  # best effort: a queued call is dropped; a running one finishes before the next batch starts
                ray.cancel(ref)
            except Exception:  # noqa: BLE001 - the error to raise is the timeout, whatever Ray says here
                pass
            raise RewardWorkerError(
                f"{self.group.describe(0)} gave no scores for {len(prompts)} rows within "
                f"reward.timeout_s={self.timeout_s:g} s; raise reward.timeout_s or lower the entry's batch_size"
            ) from None
        except RayActorError as e:
            raise RewardWorkerError(
                f"{self.group.describe(0)} is dead: {death_cause(e)}. Its rows cannot be scored; "
                "the run stops when the failure watch sees them fail"
            ) from None


def start_reward_workers(
    scorers: Mapping[str, WorkerScorer],
    plan: Mapping[str, list[dict]],
    *,
    cpus: float,
    gpus: float,
    config: dict,
    timeout_s: float,
) -> list[WorkerGroup]:
    """One ``WorkerGroup`` of one ``RewardModelWorker`` per scorer, on its planned devices; each scorer bound to it."""
    from armor_core.engine import WorkerGroup

    groups = []
    try:
        for name, scorer in scorers.items():
            group = WorkerGroup(
                RewardModelWorker,
                1,
                cpus_per_worker=cpus,
                gpus_per_worker=gpus,
                name=name,
                api=RewardModelAPI,
                init_kwargs={"scorer": scorer.local, "config": config},
                rank_kwargs=plan.get(name),
                channel=False,  # scored through Ray's call, whose result can be awaited with a timeout
            )
            groups.append(group)
            scorer.bind(WorkerClient(group, timeout_s))
    except BaseException:
        for group in groups:
            group.shutdown()
        raise
    return groups
