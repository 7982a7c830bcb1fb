"""What the driver may call on each kind of worker, declared once.

The driver names a worker method by reference to these protocols, never by a string:
``actor.dispatch(ActorAPI.update_actor, batch, step)``. ``WorkerGroup`` checks at start-up that its
worker class defines every method of its protocol, and at each call that the method belongs to the
protocol, so an editor (and a reader) follows a call from the driver to its declaration here and on
to the worker class that implements it.

How results come back (``WorkerGroup``, ``armor_core.engine``):

- ``call(method, *args)`` runs on every rank and returns the list of per-rank results;
- ``dispatch(method, data, *args)`` gives each rank its share of ``data`` and merges the results:
  DataProtos concatenated in the original row order, metric dicts merged by ``merge_metrics``.

Metrics come back one way: a dict of name -> number, either the method's return value or a
returned DataProto's ``meta_info["metrics"]``, merged over ranks by one rule (``merge_metrics``):
seconds (names ending in ``_s``) and maxima (names containing ``max``) take the largest rank's value,
everything else the mean. ``perf/worker_s`` is the seconds spent inside the worker method; the
driver's wall time minus it is the transport's (``StepTimer``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from armor_core.dataproto.protocol import DataProto

__all__ = ["ActorAPI", "CriticAPI", "RewardModelAPI", "RolloutAPI", "TeacherAPI", "TrainableAPI", "WorkerAPI"]


class WorkerAPI(Protocol):
    """Every worker: start-up checks."""

    def ping(self) -> dict[str, Any]:
        """``{"rank", "pid", ...}``: the worker is up (its constructor's errors surface here)."""
        ...

    def isolation_record(self) -> dict[str, Any]:
        """What ``ProcessIsolator`` found at start: the devices this process owns."""
        ...


class TrainableAPI(WorkerAPI, Protocol):
    """Shared by the actor and the critic: checkpoints and rollback points (``workers/rollback_point.py``)."""

    def save_checkpoint(self, path: str, background: bool = False) -> None:
        """Rank 0 writes the full state into ``path``; every rank takes part in the gathers. In the sharded form each
        rank writes its shards; with ``background`` from a thread, after copying them to host memory (the call
        returns then, and ``wait_saved`` once they are written)."""
        ...

    def wait_saved(self) -> float:
        """Return once the shards a ``background`` save started are written (raising what the write raised); the
        seconds waited, 0 when none was in flight."""
        ...

    def load_checkpoint(self, path: str, rollback: bool = False) -> None:
        """Every rank loads the full state from ``path`` (any number of ranks may have saved it). ``rollback``: a
        guard's rollback, not a resume: the learning rate in force and the worker's guard state stay."""
        ...

    def rollback_point_bytes(self) -> int:
        """The bytes one in-memory rollback point of this rank holds: its trained weights (its shards under FSDP2)
        and their optimizer state."""
        ...

    def keep_rollback_point(self, step: int, keep: list[int]) -> dict[str, float]:
        """Forget the points not in ``keep``, then copy this rank's weights, optimizer state, schedule position and
        RNG into host memory as the point of ``step``, with no gather; ``{"perf/worker_s": seconds}``."""
        ...

    def restore_rollback_point(self, step: int) -> None:
        """Put the point of ``step`` back; the learning rate in force and the worker's guard state stay."""
        ...


class ActorAPI(TrainableAPI, Protocol):
    """The actor (policy, reference, colocated rollout engine): ``armor_core.workers.actor.worker.ActorWorker``."""

    def generate(self, prompts: DataProto, greedy: bool = False, stale: bool = False) -> DataProto:
        """Responses for ``prompts`` (rows already repeated ``rollout.n`` times); ``stale``: a fault
        injection that generates with an older policy. ``meta_info["metrics"]``: ``perf/worker_s``."""
        ...

    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` of the current policy on ``data``'s responses."""
        ...

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` of the reference policy (the base model with LoRA adapters off)."""
        ...

    def update_actor(self, data: DataProto, step: int) -> dict[str, float]:
        """One PPO-style update on this rank's share; metrics merged over ranks."""
        ...

    def update_then_generate(
        self, data: DataProto, prompts: DataProto, step: int, stale: bool = False
    ) -> tuple[dict[str, float], DataProto]:
        """``update_actor``, the weight sync if needed, then ``generate(prompts)``: one round trip."""
        ...

    def needs_weight_sync(self) -> bool:
        """Whether the rollout engine holds its own copy of the weights (vLLM, FSDP2)."""
        ...

    def sync_weights(self) -> dict[str, float]:
        """Hand the new policy to the colocated rollout engine; ``{"perf/worker_s": seconds}``."""
        ...

    def policy_state(self) -> dict[str, torch.Tensor] | None:
        """The policy after the last update, for rollout workers (async); None on ranks other than 0."""
        ...

    def apply_adjustments(self, adjustments: dict[str, float]) -> None:
        """Coefficients a guard's ``adjust`` verdict set (``interfaces.ADJUSTABLE_COEFFICIENTS``)."""
        ...


class CriticAPI(TrainableAPI, Protocol):
    """The value model (PPO-GAE): ``armor_core.workers.critic.worker.CriticWorker``."""

    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` per response token."""
        ...

    def update_critic(self, data: DataProto, step: int) -> dict[str, float]:
        """One value-loss update on this rank's share; metrics merged over ranks."""
        ...


class TeacherAPI(WorkerAPI, Protocol):
    """The distillation teacher (``algorithm.distill``): ``armor_core.workers.teacher.TeacherWorker``."""

    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """``teacher_log_prob`` of each sampled response token; for ``topk_forward_kl`` also
        ``teacher_topk_log_probs`` and ``teacher_topk_ids``, (bs, R, k)."""
        ...


class RolloutAPI(WorkerAPI, Protocol):
    """A separate rollout worker (``rollout.mode=async``): ``armor_core.workers.rollout.worker.RolloutWorker``."""

    def set_weights(self, state: dict[str, torch.Tensor], version: int) -> dict[str, float]:
        """Load the policy after ``version`` updates; ``{"perf/weights_load_s": seconds}``."""
        ...

    def generate(self, prompts: DataProto, greedy: bool = False) -> DataProto:
        """Responses and ``policy_version`` per row; metrics ``perf/worker_s``, ``perf/weights_load_s``."""
        ...

    def rng_state(self) -> dict[str, Any]:
        """The sampling RNG state (checkpointed with the batches in flight)."""
        ...

    def set_rng_state(self, state: dict[str, Any]) -> None:
        """Restore what ``rng_state`` returned."""
        ...


class RewardModelAPI(WorkerAPI, Protocol):
    """A reward model or local judge on a worker of its own: ``armor_core.workers.reward_model.RewardModelWorker``."""

    def score(
        self, prompts: list[str], responses: list[str], ground_truths: list[Any], extras: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """``{"results": [RewardResult or Exception per row], "pid", "seconds"}``."""
        ...

    def stats(self) -> dict[str, Any]:
        """``{"pid", "device", "dtype", "calls", "rows"}``: what this worker has scored."""
        ...
