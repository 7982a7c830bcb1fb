"""Where a reward model or local judge runs: ``placement: pool | worker`` in a ``reward.model`` or
``reward.judge`` entry.

    reward:
      model: [{path: runs/rm, data_sources: [chat], placement: worker}]

``placement: pool`` (the default) scores the model in the reward pool's processes, which share the driver's
cores: right for a tiny model. ``placement: worker`` gives it a Ray actor of its own
(``armor_core.workers.reward_model``, one per entry) that the trainer places like the actor and critic groups:
the ProcessIsolator plans its cores (and ``engine.gpus_per_worker`` GPUs) with the others', so more workers than
cores is one error at start, and ``isolation.json`` lists it as group ``reward_model:<domain>``. On a GPU the
model runs there, in bfloat16 under ``dtype: auto``.

The domain is then an inline batched domain on the driver (``WorkerScorer``): each batch's rows of the domain go
to the worker in one call, awaited at most ``reward.timeout_s`` seconds (the sub-score ``worker_s``, logged as
``reward/<domain>/worker_s``, is the seconds the worker spent on the batch); a late answer fails the batch's rows,
and a dead worker fails them with Ray's account of its death (``RewardWorkerError``). Either way the failures
count toward the failure watch, which stops the run. Outside a training run (``armor reward``) no worker is
started and the scorer runs in the calling process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

from armor_core.interfaces import RewardDomain, RewardResult
from armor_core.rewards.batch import OneRowFromBatch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["GROUP_PREFIX", "RewardWorkerError", "WorkerScorer", "placed", "worker_scorers"]

GROUP_PREFIX = "reward_model:"


class LocalScorer(Protocol):
    """What a reward model or local judge offers to be run on a worker (``ClassifierReward``, ``LocalJudge``)."""

    device: str
    threads: int

    def load(self) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]: ...

    def __call__(self, prompt: str, response: str, ground_truth: Any, extra: Mapping[str, Any]) -> RewardResult: ...

    def score_batch(
        self, prompts: Sequence[str], responses: Sequence[str], ground_truths: Sequence[Any], extras: Sequence[Any]
    ) -> list[RewardResult | Exception]: ...


class WorkerClient(Protocol):
    """The driver's handle on a started reward-model worker (``armor_core.workers.reward_model.WorkerClient``)."""

    def score(self, prompts: list[str], responses: list[str], ground_truths: list[Any],
              extras: list[dict[str, Any]]) -> dict[str, Any]: ...  # fmt: skip


class RewardWorkerError(RuntimeError):
    """The reward-model worker did not answer: it died, or took longer than ``reward.timeout_s``."""


class WorkerScorer(OneRowFromBatch):
    """The driver's side of a ``placement: worker`` domain: its ``fn`` and ``batch_fn``."""

    def __init__(self, local: LocalScorer, where: str) -> None:
        self.local, self.where = local, where
        self.client: WorkerClient | None = None  # once the trainer started the worker

    def __repr__(self) -> str:
        return f"WorkerScorer({self.local!r})"

    def bind(self, client: WorkerClient | None) -> None:
        self.client = client

    def score_batch(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        ground_truths: Sequence[Any],
        extras: Sequence[Mapping[str, Any]],
    ) -> list[RewardResult | Exception]:
        if self.client is None:  # armor reward, a test: no worker, the model in this process
            return self.local.score_batch(prompts, responses, ground_truths, extras)
        try:
            answer = self.client.score(list(prompts), list(responses), list(ground_truths), [dict(e) for e in extras])
        except RewardWorkerError as e:
            raise RewardWorkerError(f"{self.where}: {e}") from None
        for result in answer["results"]:  # logged as reward/<domain>/worker_s: the worker's seconds for the batch
            if isinstance(result, RewardResult):
                result.sub_scores["worker_s"] = answer["seconds"]
        return answer["results"]


def placed(
    scorer: LocalScorer, placement: str, requires_ground_truth: bool, description: str, where: str
) -> RewardDomain:
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
