"""A reward model or local judge on a worker of its own: ``placement: worker`` in a ``reward.model`` or
``reward.judge`` entry.

    reward:
      model: [{path: runs/rm, data_sources: [chat], placement: worker}]

``placement: pool`` (the default) scores the model in the reward pool's processes, which share the driver's
cores: right for a tiny model. ``placement: worker`` gives it a Ray actor (``RewardModelWorker``, one per
entry) that the trainer places like the actor and critic groups: the ProcessIsolator plans its cores (and
``engine.gpus_per_worker`` GPUs) with the others', so more workers than cores is one error at start, and
``isolation.json`` lists it as group ``reward_model:<domain>``. On a GPU the model runs there, in bfloat16 under
``dtype: auto``.

The domain is then an inline batched domain on the driver (``WorkerScorer``): each batch's rows of the domain go
to the worker in one call, awaited at most ``reward.timeout_s`` seconds (the sub-score ``worker_s``, logged as
``reward/<domain>/worker_s``, is the seconds the worker spent on the batch); a late answer fails the batch's rows
(the worker is asked to drop the call), and a dead worker fails them with Ray's account of its death. Either way
the failures count toward the failure watch, which stops the run. Outside a training run (``armor reward``) no
worker is started and the scorer runs in the calling process.
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping, Protocol, Sequence

from armor_core.interfaces import RewardDomain, RewardResult
from armor_core.workers.api import WorkerAPI

__all__ = ["RewardModelAPI", "RewardModelWorker", "WorkerScorer", "placed", "start_reward_workers", "worker_scorers"]

GROUP_PREFIX = "reward_model:"


class LocalScorer(Protocol):
    """What a reward model or local judge offers to be run on a worker (``ClassifierReward``, ``LocalJudge``)."""

    device: str
    threads: int

    def load(self) -> Any: ...

    def score_batch(
        self, prompts: Sequence[str], responses: Sequence[str], ground_truths: Sequence[Any], extras: Sequence[Any]
    ) -> list[RewardResult | Exception]: ...


class RewardModelAPI(WorkerAPI, Protocol):
    """A reward-model worker: ``RewardModelWorker``."""

    def score(
        self, prompts: list[str], responses: list[str], ground_truths: list[Any], extras: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """``{"results": [RewardResult or Exception per row], "pid", "seconds"}``."""

    def stats(self) -> dict[str, Any]:
        """``{"pid", "device", "dtype", "calls", "rows"}``: what this worker has scored."""


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


class RewardWorkerError(RuntimeError):
    """The reward-model worker did not answer: it died, or took longer than ``reward.timeout_s``."""


class WorkerScorer:
    """The driver's side of a ``placement: worker`` domain: its ``fn`` and ``batch_fn``."""

    def __init__(self, local: LocalScorer, where: str) -> None:
        self.local, self.where = local, where
        self.group: Any = None  # the WorkerGroup, once the trainer started it
        self.timeout_s = float("inf")

    def __repr__(self) -> str:
        return f"WorkerScorer({self.local!r})"

    def bind(self, group: Any, timeout_s: float) -> None:
        self.group, self.timeout_s = group, float(timeout_s)

    def __call__(self, prompt: str, response: str, ground_truth: Any, extra: Mapping[str, Any]) -> RewardResult:
        from armor_core.rewards.remote import one_result

        return one_result(self.score_batch([prompt], [response], [ground_truth], [extra]))

    def score_batch(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        ground_truths: Sequence[Any],
        extras: Sequence[Mapping[str, Any]],
    ) -> list[RewardResult | Exception]:
        if self.group is None:  # armor reward, a test: no worker, the model in this process
            return self.local.score_batch(prompts, responses, ground_truths, extras)
        import ray

        from armor_core.engine import death_cause

        args = (list(prompts), list(responses), list(ground_truths), [dict(e) for e in extras])
        ref = self.group.call_rank(0, RewardModelAPI.score, *args)
        try:
            answer = ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            try:  # best effort: a queued call is dropped; a running one finishes before the next batch starts
                ray.cancel(ref)
            except Exception:  # noqa: BLE001 - the error to raise is the timeout, whatever Ray says here
                pass
            raise RewardWorkerError(
                f"{self.where}: {self.group.describe(0)} gave no scores for {len(prompts)} rows within "
                f"reward.timeout_s={self.timeout_s:g} s; raise reward.timeout_s or lower the entry's batch_size"
            ) from None
        except ray.exceptions.RayActorError as e:
            raise RewardWorkerError(
                f"{self.where}: {self.group.describe(0)} is dead: {death_cause(e)}. Its rows cannot be scored; "
                "the run stops when the failure watch sees them fail"
            ) from None
        for result in answer["results"]:  # logged as reward/<domain>/worker_s: the worker's seconds for the batch
            if isinstance(result, RewardResult):
                result.sub_scores["worker_s"] = answer["seconds"]
        return answer["results"]


def placed(scorer: Any, placement: str, requires_ground_truth: bool, description: str, where: str) -> RewardDomain:
    """The domain of a model entry: batched in the reward pool (``pool``) or on a worker of its own (``worker``)."""
    if placement == "worker":
        remote = WorkerScorer(scorer, where)
        return RewardDomain(
            fn=remote,
            batch_fn=remote.score_batch,
            inline=True,  # the driver only waits on the worker, with reward.timeout_s as its bound
            score_range=None,
            requires_ground_truth=requires_ground_truth,
            description=f"{description}, on a worker of its own",
        )
    return RewardDomain(
        fn=scorer,
        batch_fn=scorer.score_batch,
        warmup=scorer.load,
        score_range=None,
        requires_ground_truth=requires_ground_truth,
        description=description,
    )


def worker_scorers(domains: Mapping[str, RewardDomain]) -> dict[str, WorkerScorer]:
    """``{group name: scorer}`` for the domains placed on workers of their own."""
    return {GROUP_PREFIX + name: d.fn for name, d in domains.items() if isinstance(d.fn, WorkerScorer)}


def start_reward_workers(
    scorers: Mapping[str, WorkerScorer],
    plan: Mapping[str, list[dict]],
    *,
    cpus: float,
    gpus: float,
    config: dict,
    timeout_s: float,
) -> list[Any]:
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
            scorer.bind(group, timeout_s)
    except BaseException:
        for group in groups:
            group.shutdown()
        raise
    return groups
