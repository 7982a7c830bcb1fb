"""Where a step's rows come from, and where its update goes: ``RolloutSource``.

Three ways to get a generated batch, one object that knows which applies:

- **now**: the actor workers generate the step's prompts (``generate``);
- **queued**: the previous step's worker call already generated them after its update
  (``trainer.overlap_generation``: ``update_then_generate``, one round trip a step; the workers do
  the same work in the same order as with two calls, so results are bit-identical);
- **async**: rollout workers of their own generated them while the actor trained
  (``rollout.mode=async``, ``async_rollout.py``).

``collect`` adds scoring and, with ``algorithm.filter_groups`` (DAPO's dynamic sampling), drops the
groups whose scores all agree and generates more until the batch is full. ``update`` sends the
actor's update, with the next step's generation in the same call when overlap applies, and the
weight sync a separate engine needs.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from armor_core.dataproto.metrics import merge_metrics
from armor_core.loop.async_rollout import environment_metrics, generation_request
from armor_core.loop.step_timer import StepTimer
from armor_core.models.routing_replay import ROUTES
from armor_core.ops.sampling_replay import KEPT_IDS, same_kept_width
from armor_core.workers.api import ActorAPI

if TYPE_CHECKING:
    from armor_core.config.schema import ArmorConfig
    from armor_core.dataproto.protocol import DataProto
    from armor_core.engine import WorkerGroup
    from armor_core.loop.async_rollout import AsyncRollout
    from armor_core.loop.data import PromptLoader
    from armor_core.stability.faults import Faults

__all__ = ["RolloutSource"]


@dataclass
class _Queued:
    """The next step's prompts (repeated ``rollout.n`` times) and their rollout, already generated (or None: generate
    it)."""

    gen_in: DataProto
    out: DataProto | None
    metrics: dict = field(default_factory=dict)  # the rollout's env/... metrics, logged with the step that trains it


class RolloutSource:
    """A step's generated rows (``generated``, ``collect``) and the actor's update (``update``)."""

    def __init__(
        self,
        cfg: ArmorConfig,
        actor: WorkerGroup,
        loader: PromptLoader,
        faults: Faults,
        async_rollout: AsyncRollout | None = None,
        needs_weight_sync: bool = False,
    ) -> None:
        self.cfg, self.actor, self.loader, self.faults = cfg, actor, loader, faults
        self.async_rollout = async_rollout
        self.multi_turn = cfg.rollout.multi_turn.enable
        self.needs_weight_sync = (
            needs_weight_sync  # a colocated engine that does not share the actor's module (vllm, FSDP2)
        )
        self.queued: _Queued | None = None  # the next step's generation, when already sent

    # -- rows -----------------------------------------------------------------------------------

    def generated(self, step: int, timer: StepTimer, metrics: dict[str, float]) -> DataProto:
        """Step ``step``'s prompts, each repeated ``rollout.n`` times, with their responses."""
        if self.async_rollout is not None:
            timer.add("update_weights", self.async_rollout.push(step - 1))
            with timer("gen"):  # the wait for a batch the rollout workers generated while the actor trained
                gen_in, out = self.async_rollout.next(step - 1)
            rollout_metrics = out.meta_info.pop("metrics", {})
            metrics.update(environment_metrics(rollout_metrics))
            metrics["perf/rollout_worker_s"] = rollout_metrics.get("perf/worker_s", 0.0)
            metrics["perf/rollout_weights_load_s"] = rollout_metrics.get("perf/weights_load_s", 0.0)
            metrics["perf/verify_sync_s"] = rollout_metrics.get("perf/verify_sync_s", 0.0)
            return _joined(gen_in, out)
        queued, self.queued = self.queued, None
        with timer("data"):
            gen_in = queued.gen_in if queued is not None else self.loader.next_samples(self.cfg.rollout.n)
        if (
            queued is not None and queued.out is not None
        ):  # generated at the end of the last step's call, and timed there
            timer.add("gen", 0.0)
            metrics.update(queued.metrics)
            return _joined(gen_in, queued.out)
        with timer("gen") as stage:
            stale = self.faults.at("stale_rollout", step) is not None
            out = self.actor.dispatch(ActorAPI.generate, generation_request(gen_in, self.multi_turn), stale=stale)
            rollout_metrics = out.meta_info.pop("metrics", {})
            stage.worker_s = rollout_metrics.get("perf/worker_s")
            metrics.update(environment_metrics(rollout_metrics))
        return _joined(gen_in, out)

    def collect(
        self,
        step: int,
        score: Callable[[DataProto], tuple[torch.Tensor, dict]],
        timer: StepTimer,
        metrics: dict[str, float],
    ) -> tuple[DataProto, torch.Tensor]:
        """Step ``step``'s scored rows: ``score(batch) -> (scores, metrics)`` on each generated batch.
        With ``algorithm.filter_groups`` the groups whose scores all agree are dropped and more
        batches are generated until ``data.train_batch_size`` groups are kept or
        ``algorithm.max_gen_batches`` were generated; the batch's ``uid`` then numbers the kept groups."""
        cfg = self.cfg
        batch = self.generated(step, timer, metrics)
        with timer("reward"):
            scores, reward_metrics = score(batch)
        if cfg.algorithm.filter_groups:
            batch, scores = self._filtered(step, batch, scores, reward_metrics, score, timer, metrics)
        else:
            metrics.update(reward_metrics)
        if "policy_version" in batch and len(batch):  # async: how many updates old the trained rows' policy is
            staleness = (step - 1) - batch["policy_version"]
            metrics.update(
                {
                    "rollout/staleness_mean": float(staleness.float().mean()),
                    "rollout/staleness_max": float(staleness.max()),
                    "rollout/policy_version": float(batch["policy_version"].float().mean()),
                }
            )
        return batch, scores

    def _filtered(self, step, batch, scores, reward_metrics, score, timer, metrics) -> tuple[DataProto, torch.Tensor]:
        from armor_core.dataproto.protocol import DataProto

        cfg, n, want = self.cfg, self.cfg.rollout.n, self.cfg.data.train_batch_size
        kept, kept_scores, all_metrics, generated = [], [], [reward_metrics], 0
        for gen in range(cfg.algorithm.max_gen_batches):
            if gen:
                batch = self.generated(step, timer, metrics)
                with timer("reward"):
                    scores, reward_metrics = score(batch)
                all_metrics.append(reward_metrics)
            groups = scores.view(-1, n)
            informative = (groups != groups[:, :1]).any(-1).repeat_interleave(n)
            generated += len(groups)
            kept.append(batch[informative.numpy()])
            kept_scores.append(scores[informative])
            if sum(len(k) for k in kept) >= want * n:
                break
        batch, scores = DataProto.concat(_same_width(kept)), torch.cat(kept_scores)
        n_groups = min(want, len(batch) // n)
        workers = cfg.actor.num_workers
        n_groups -= n_groups % (workers // math.gcd(n, workers))  # rows split evenly over the actor's ranks
        batch, scores = batch[np.arange(n_groups * n)], scores[: n_groups * n]
        batch["uid"] = np.repeat(np.arange(n_groups, dtype=np.int64), n)
        for key in set().union(*all_metrics):  # each batch's reward metrics, averaged
            values = [m[key] for m in all_metrics if key in m]
            metrics[key] = sum(values) / len(values)
        metrics.update(
            {
                "dynamic_sampling/gen_batches": gen + 1,
                "dynamic_sampling/groups_generated": generated,
                "dynamic_sampling/groups_kept": n_groups,
                "dynamic_sampling/groups_dropped": generated - sum(len(k) for k in kept) // n,
                "dynamic_sampling/short_batch": float(n_groups < want),
            }
        )
        if n_groups < want:
            warnings.warn(
                f"step {step}: algorithm.filter_groups kept {n_groups} of data.train_batch_size={want} groups after "
                f"algorithm.max_gen_batches={cfg.algorithm.max_gen_batches} batches ({generated} groups generated, "
                "the rest all scored alike); training on those",
                stacklevel=2,
            )
        return batch, scores

    # -- the update -----------------------------------------------------------------------------

    def update(self, update_in: DataProto, step: int, timer: StepTimer) -> dict[str, float]:
        """The actor's update for step ``step`` and whatever keeps the rollout in step with it:
        the next step's generation in the same call (overlap) or the weight sync."""
        next_in = self._next_generation_input(step)
        if next_in is not None:
            return self._update_then_generate(update_in, next_in, step, timer)
        with timer("update_actor") as stage:
            metrics = self.actor.dispatch(ActorAPI.update_actor, update_in, step)
            stage.worker_s = metrics.pop("perf/worker_s", None)
        if self.needs_weight_sync:
            with timer("update_weights") as stage:  # the check of the sync included (perf/verify_sync_s)
                sync = merge_metrics(self.actor.call(ActorAPI.sync_weights))
                stage.worker_s = sync.pop("perf/worker_s")
            metrics.update(sync)
        else:
            timer.add("update_weights", 0.0)
        return metrics

    def _next_generation_input(self, step: int) -> DataProto | None:
        """With ``trainer.overlap_generation``: the next step's prompts (repeated ``rollout.n``
        times), to be generated in the same worker call as step ``step``'s update; else None.

        The workers then run the same work in the same order as with two calls (update, sync,
        generate), so samples, RNG and weights are unchanged; what goes is a round trip and the
        workers' idle time while the driver handles the update's result. Not before a step after
        which the driver calls the workers for something else (validation; a checkpoint, whose RNG
        state must be the one before this generation), after the last step, or when the next batch
        would start an epoch that ``trainer.total_epochs`` forbids; never in async mode.
        """
        t = self.cfg.trainer
        if (
            not t.overlap_generation
            or self.async_rollout is not None
            or step >= t.total_steps
            or (t.val_freq and step % t.val_freq == 0)
            or (t.save_freq and step % t.save_freq == 0)
            or (t.total_epochs is not None and self.loader.next_starts_epoch)
        ):
            return None
        return self.loader.next_samples(self.cfg.rollout.n)

    def _update_then_generate(
        self, update_in: DataProto, next_in: DataProto, step: int, timer: StepTimer
    ) -> dict[str, float]:
        """One worker call: step ``step``'s update and the next step's generation. The generation's
        seconds count in this step's ``timing_s/gen``: each step's timings hold the work done
        during it, so they still add up to ``timing_s/step``."""
        stale = self.faults.at("stale_rollout", step + 1) is not None
        t0 = time.perf_counter()
        metrics, out = self.actor.submit_pair(
            ActorAPI.update_then_generate, update_in, generation_request(next_in, self.multi_turn), step, stale=stale
        ).result()
        wall = time.perf_counter() - t0
        update_s = metrics.pop("perf/worker_s", 0.0)
        sync_s = metrics.pop("perf/sync_s", 0.0)
        rollout_metrics = out.meta_info.pop("metrics", {})
        gen_s = rollout_metrics.get("perf/worker_s", 0.0)
        timer.add("update_actor", update_s)
        timer.add("update_weights", sync_s)
        timer.add("gen", gen_s)
        timer.add("overhead", max(0.0, wall - update_s - sync_s - gen_s))
        self.queued = _Queued(next_in, out, environment_metrics(rollout_metrics))
        metrics["perf/next_generated"] = 1.0  # this step's call also generated the next step's rollout
        return metrics

    # -- validation, checkpoints, rollbacks -----------------------------------------------------

    def generate(self, prompts: DataProto, version: int, greedy: bool) -> DataProto:
        """Generate now (validation) with the policy after ``version`` updates."""
        if self.async_rollout is not None:
            return self.async_rollout.generate(prompts, version, greedy=greedy)
        return self.actor.dispatch(ActorAPI.generate, prompts, greedy=greedy)

    @property
    def ranks(self) -> int:
        """How many workers share a generate call (a validation batch is padded to a multiple)."""
        return self.async_rollout.group.n if self.async_rollout is not None else self.actor.n

    def loader_state(self) -> dict:
        """The data position a checkpoint keeps: before any batch generated but not yet trained on in async mode."""
        return self.async_rollout.loader_state() if self.async_rollout is not None else self.loader.state_dict()

    def forget_samples(self) -> None:
        """After a rollback: what was generated came from the discarded weights. The next step's
        prompts stay queued (so no data is skipped); their samples are dropped and generated again."""
        if self.queued is not None:
            self.queued = _Queued(self.queued.gen_in, None)

    def reset(self, checkpoint: Path | None = None) -> None:
        """After loading a checkpoint: the data position and the weights went back. Async batches in
        flight are dropped, or, on a resume (``checkpoint``), replaced by the ones it saved."""
        if self.async_rollout is not None:
            self.async_rollout.drop()
            if checkpoint is not None:
                self.async_rollout.restore(checkpoint, self.cfg.trainer.allow_legacy_pt_state)

    def save(self, directory: Path) -> None:
        """Into a checkpoint being written: the async batches in flight (``AsyncRollout.save``)."""
        if self.async_rollout is not None:
            self.async_rollout.save(directory)


def _joined(gen_in: DataProto, out: DataProto) -> DataProto:
    """The prompts' non-tensor columns (data_source, ground truth, ...) beside the generated tensors."""
    added = [k for k in out.non_tensors if k not in gen_in.non_tensors]  # a multi-turn rollout's reward_text, ...
    return gen_in.select(non_tensor_keys=list(gen_in.non_tensors)).union(
        out.select(tensor_keys=list(out.tensors), non_tensor_keys=added)
    )


def _same_width(batches: list[DataProto]) -> list[DataProto]:
    """``batches`` with their response columns right-padded to the widest: a multi-turn rollout's width is its
    longest episode, so two generated batches of one step may differ. Padding is masked (``attention_mask`` and
    ``response_mask`` 0) and its positions go on counting up, as a single-turn rollout's padding does; kept sets
    (sampling-mask replay) are padded with -1 to the widest set, and the new positions hold none, nor routes."""
    from armor_core.dataproto.protocol import DataProto

    batches = same_kept_width(batches)
    width = max(b.tensors["responses"].shape[1] for b in batches if len(b))
    out = []
    for b in batches:
        short = width - b.tensors["responses"].shape[1] if len(b) else 0
        if short <= 0:
            out.append(b)
            continue
        r, full = b.tensors["responses"].shape[1], b.tensors["input_ids"].shape[1]
        tensors = {}
        for key, t in b.tensors.items():
            if key != "prompts" and t.dim() >= 2 and t.shape[1] in (r, full):
                tail = t.new_full((t.shape[0], short, *t.shape[2:]), -1 if key in (KEPT_IDS, ROUTES) else 0)
                if key == "position_ids":
                    tail = t[:, -1:] + torch.arange(1, short + 1, dtype=t.dtype)
                t = torch.cat([t, tail], dim=1)
            tensors[key] = t
        out.append(DataProto.from_dict(tensors=tensors, non_tensors=dict(b.non_tensors), meta_info=dict(b.meta_info)))
    return out
