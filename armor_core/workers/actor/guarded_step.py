"""The actor's optimizer step under the guards, and the coefficients a guard may change.

``ActorWorker.update_actor`` runs, per mini-batch, ``_accumulate`` (forward and backward: the loss)
and then ``_guarded_step`` (what happens to the gradients it left: clipping, the worker-side guard
stages ``grad`` and ``step``, the optimizer and schedule steps, the fault injections aimed at them).
The two share only the gradients on the parameters and the metric sums, so the step lives here,
apart from the loss. ``apply_adjustments`` is here too: a guard's ``adjust`` verdict sets the
coefficients, whether it comes from these stages or from the driver (``ActorAPI.apply_adjustments``).

``ActorWorker`` (``workers/actor/worker.py``) takes these methods from ``GuardedStep``; they read the
worker's config, model, optimizer, scheduler, guard runner and faults.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Mapping

import torch

from armor_core.interfaces import ADJUSTABLE_COEFFICIENTS
from armor_core.workers.actor.optim import local_params, update_stats
from armor_core.workers.actor.policy_shift import PolicyShiftProbe
from armor_core.workers.common import add_metric, scalar
from armor_core.workers.parallel.collectives import agreed_norm, global_sums
from armor_core.workers.parallel.strategy import local_part

if TYPE_CHECKING:
    from armor_core.config.schema import ArmorConfig
    from armor_core.dataproto.protocol import DataProto
    from armor_core.interfaces import Verdict
    from armor_core.stability.faults import Faults
    from armor_core.stability.guard import GuardRunner
    from armor_core.workers.forward.logprobs import ResponseLogProbs

__all__ = ["GuardedStep"]


class GuardedStep:
    """Clip, guard and step the optimizer of ``ActorWorker``; apply guard adjustments."""

    cfg: ArmorConfig
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    guard: GuardRunner
    faults: Faults
    rank: int
    world_size: int
    watch_step: bool
    _judged_lr: float
    probe: PolicyShiftProbe
    logp: ResponseLogProbs
    train_module: torch.nn.Module
    _seconds: dict[str, float]

    def _guarded_step(self, parts: dict[str, float], step: int, first: bool, sums: dict[str, list[float]]) -> None:
        """Clip the accumulated gradients, show them to the guards (stage ``grad``), and step the
        optimizer unless a guard said skip; then stage ``step`` (if a guard watches it) may undo it."""
        a = self.cfg.actor
        nan_fault = self.faults.at("nan_grad", step)
        if nan_fault and (nan_fault.value is None or int(nan_fault.value) == self.rank):
            g = next(p.grad for p in self.model.parameters() if p.grad is not None)
            local_part(g).view(-1)[0] = float("nan")  # FSDP2: this rank's shard
        t0 = time.perf_counter()
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), a.grad_clip if a.grad_clip > 0 else float("inf")
        )
        self._seconds["optimizer"] += time.perf_counter() - t0  # clipping is part of the optimizer's step
        gn = agreed_norm(scalar(grad_norm), self.world_size, a.strategy == "fsdp2")
        add_metric(sums, "actor/grad_norm", gn)
        for k, v in zip(parts, global_sums(list(parts.values()), self.world_size)):
            add_metric(sums, k, v)
        # every rank must reach the same verdict from the same numbers: the norm is agreed
        # above, the loss is global (its contributions summed over micro-batches and ranks)
        stats = {"grad_norm": gn, "pg_loss": sums["actor/pg_loss"][-1]}
        if first and "rollout/logprob_diff_mean" in sums:
            stats.update({k: sums[k][-1] for k in ("rollout/logprob_diff_mean", "rollout/logprob_diff_max")})
        verdict = self.guard.observe("grad", stats, step)
        self._apply_worker_adjustments(verdict, sums)  # also those riding on a skip: the events say they were made
        if verdict.action in ("skip", "rollback"):
            self.probe.reset()
            self.optimizer.zero_grad(set_to_none=True)
            add_metric(sums, "actor/skipped_updates", 1.0)
            return
        if verdict.action == "scale":
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(verdict.scale)
        lr_fault = self.faults.at("lr_scale", step)
        if lr_fault:
            saved = [g["lr"] for g in self.optimizer.param_groups]
            for g in self.optimizer.param_groups:
                g["lr"] *= lr_fault.value
        # the rate this optimizer step uses, a guard's adjustment and the fault included (the fault is undone below)
        add_metric(sums, "actor/lr", self.optimizer.param_groups[0]["lr"])
        judged = self._judges(step)
        before = local_params(self.model, clone=True) if judged else None
        t0 = time.perf_counter()
        self.optimizer.step()
        self._seconds["optimizer"] += time.perf_counter() - t0
        if lr_fault:
            for g, lr in zip(self.optimizer.param_groups, saved):
                g["lr"] = lr
        self.scheduler.step()
        if before is None:
            self.probe.reset()
        elif self._observe_step(before, step, sums).action in ("skip", "rollback"):
            # put the parameters back; Adam's moments keep the gradient
            torch._foreach_copy_(local_params(self.model), before)
            add_metric(sums, "actor/skipped_updates", 1.0)
            return
        add_metric(sums, "actor/skipped_updates", 0.0)

    def _judges(self, step: int) -> bool:
        """Whether stage ``step`` runs for this optimizer step: it costs a copy of the parameters (and the probe's
        forward), so it runs when a guard watching it wants this step (``GuardRunner.watches_at``), and always for a
        step taken at a rate over 1.25x the last judged one's (a spike the guard's own cadence could miss)."""
        if not self.watch_step:
            return False
        lr = self.optimizer.param_groups[0]["lr"]  # as this step uses it: schedule and injected faults included
        if lr > 1.25 * self._judged_lr or self.guard.watches_at("step", step):
            self._judged_lr = lr
            return True
        return False

    def _observe_step(self, before: list[torch.Tensor], step: int, sums: dict[str, list[float]]) -> Verdict:
        """Stage ``step``: how far the update moved the weights (and the policy, if a guard needs it), judged."""
        stats = update_stats(
            self.model,
            before,
            self.world_size > 1 and self.cfg.actor.strategy == "fsdp2",
            float(self.scheduler.base_lrs[0]),
        )
        t0 = time.perf_counter()
        stats.update(self.probe.measure(self._probe_forward, self.world_size))
        self._seconds["probe"] += time.perf_counter() - t0
        add_metric(sums, "actor/update_ratio", stats["update_ratio"])
        if "policy_kl" in stats:
            add_metric(sums, "actor/policy_kl", stats["policy_kl"])
            add_metric(sums, "actor/policy_kl_max", stats["policy_kl"])
        if "teacher_kl" in stats:
            add_metric(sums, "actor/teacher_kl", stats["teacher_kl"])
        verdict = self.guard.observe("step", stats, step)
        self._apply_worker_adjustments(verdict, sums)
        return verdict

    def _probe_forward(self, mini: DataProto, idx: torch.Tensor) -> torch.Tensor:
        # DDP's replicas are identical after the step: the bare model, no DDP forward (its buffer broadcast is a
        # collective outside the training pass); under FSDP2 the model is the sharded root, its forward a collective
        lp = self.logp.forward(self.model, mini, idx, with_entropy=False, count=False)[0]
        # FSDP2 leaves the root's parameters gathered after a forward without backward: shard them again, or
        # the parameters put back by a skip (this rank's shards) would not fit them
        from torch.distributed.fsdp import FSDPModule

        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        return lp

    def _apply_worker_adjustments(self, verdict: Verdict, sums: dict[str, list[float]]) -> None:
        if verdict.adjustments:  # decided from global statistics, so identical on every rank
            self._set_coefficients(verdict.adjustments)
            for k, v in verdict.adjustments.items():
                add_metric(sums, f"guard/adjust/{k}", v)

    ADJUSTABLE = ADJUSTABLE_COEFFICIENTS

    def apply_adjustments(self, adjustments: dict[str, float]) -> None:
        """Coefficients a verdict of a driver stage changed (``ActorAPI.apply_adjustments``): set, and the worker's
        guards told (``GuardRunner.adjusted``: one that keeps its own view of a coefficient, as ``trust_region`` does
        of the rate it may give back, would otherwise undo the change)."""
        self._set_coefficients(adjustments)
        self.guard.adjusted(adjustments)

    def _set_coefficients(self, adjustments: Mapping[str, float]) -> None:
        """Coefficients a guard changed (absolute values). ``lr`` is the base rate the schedule scales."""
        for key, value in adjustments.items():
            if key not in self.ADJUSTABLE:
                raise ValueError(f"a guard asked to adjust {key!r}; adjustable: {', '.join(self.ADJUSTABLE)}")
            if key == "lr":
                self.scheduler.base_lrs = [float(value)] * len(self.optimizer.param_groups)
                factor = self.scheduler.lr_lambdas[0](self.scheduler.last_epoch)
                for group in self.optimizer.param_groups:
                    group["lr"] = float(value) * factor
            else:
                setattr(self.cfg.actor, key, float(value))
