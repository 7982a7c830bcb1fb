"""Rollback points in a worker's memory: what a guard's rollback restores when no checkpoint is recent enough.

A point is one rank's own training state copied into host memory: the parameters its optimizer trains (its
shards under FSDP2: nothing is gathered, each rank copies what it holds), their optimizer state (Adam's moments,
shards too), the learning-rate schedule's position, the torch RNG state and the update counter. The driver
decides when a point is kept and which one is restored (``loop/rollback.py``); ``RollbackPoints`` holds the
points of one worker, by step.

A restore puts back the weights and the optimizer's moments, not the coefficients the guards set since: the
learning rate in force stays (``rates_kept``), so a rate a guard lowered, before the rollback or with it, is
not undone by the schedule's state coming back; the worker's guards keep their state, as the driver's do. A
checkpoint restored for a rollback keeps them the same way (``ActorWeights.load_checkpoint(rollback=True)``).
"""

from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch.optim.lr_scheduler import LambdaLR  # the actor's schedule; the critic has none

from armor_core.workers.parallel.strategy import local_part

__all__ = ["RollbackPoint", "RollbackPoints", "point_bytes", "rates_kept"]


@dataclass
class _Copy:
    """A tensor's local part in host memory, and what it takes to make the tensor again."""

    data: torch.Tensor
    device: torch.device
    spec: tuple | None  # a DTensor's (mesh, placements, shape, stride)

    @classmethod
    def of(cls, t: torch.Tensor) -> _Copy:
        from torch.distributed.tensor import DTensor

        local = local_part(t.detach())
        spec = (t.device_mesh, t.placements, t.shape, t.stride()) if isinstance(t, DTensor) else None
        return cls(local.to("cpu", copy=True), local.device, spec)

    def put_into(self, current: torch.Tensor | None) -> torch.Tensor:
        """``current`` with these values copied in place, or a new tensor like the one copied when there is none."""
        if current is not None and local_part(current).shape == self.data.shape:
            local_part(current).copy_(self.data)
            return current
        t = self.data.to(self.device, copy=True)
        if self.spec is None:
            return t
        from torch.distributed.tensor import DTensor

        mesh, placements, shape, stride = self.spec
        return DTensor.from_local(t, mesh, placements, run_check=False, shape=shape, stride=stride)


def _trained(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters ``optimizer`` changes (with LoRA the adapters only: the frozen rest never changes)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def point_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes a point of this rank holds: the trained parameters' local parts and their optimizer state (AdamW's
    two moments, each the size of its parameter, while no step has made the state yet)."""
    weights = sum(local_part(p.detach()).numel() * p.element_size() for p in _trained(optimizer))
    state = sum(
        local_part(v).numel() * v.element_size()
        for p in _trained(optimizer)
        for v in optimizer.state.get(p, {}).values()
        if isinstance(v, torch.Tensor)
    )
    return weights + (state if optimizer.state else 2 * weights)


@contextmanager
def rates_kept(optimizer: torch.optim.Optimizer, scheduler: LambdaLR) -> Iterator[None]:
    """Around a restore of ``optimizer`` and ``scheduler``: the base learning rates in force now stay (a guard's
    ``lr`` is a base rate, ``GuardedStep.apply_adjustments``), applied at the restored schedule position."""
    base = list(scheduler.base_lrs)
    yield
    scheduler.base_lrs = base
    for group, lr, factor in zip(optimizer.param_groups, base, scheduler.lr_lambdas):
        group["lr"] = lr * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


class RollbackPoint:
    """One rank's training state at one moment, in host memory (see the module docstring)."""

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: LambdaLR | None, global_step: int) -> None:
        params = _trained(optimizer)
        self.weights = [_Copy.of(p) for p in params]
        self.optimizer = [
            {k: _Copy.of(v) if isinstance(v, torch.Tensor) else copy.deepcopy(v) for k, v in optimizer.state[p].items()}
            if p in optimizer.state
            else None
            for p in params
        ]
        self.scheduler = copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None
        self.rng = torch.get_rng_state()
        device = params[0].device if params else torch.device("cpu")
        self.cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        self.global_step = global_step

    @property
    def nbytes(self) -> int:
        copies = [*self.weights, *(c for s in self.optimizer if s for c in s.values() if isinstance(c, _Copy))]
        return sum(c.data.numel() * c.data.element_size() for c in copies)

    @torch.no_grad()
    def restore(self, optimizer: torch.optim.Optimizer, scheduler: LambdaLR | None) -> int:
        """Put this point back into ``optimizer``'s parameters and state, ``scheduler`` and the RNG; the learning
        rates in force stay (``rates_kept``). Returns the update counter kept with it."""
        params = _trained(optimizer)
        if len(params) != len(self.weights):
            raise RuntimeError(f"a rollback point of {len(self.weights)} parameters cannot restore {len(params)}")
        for p, saved in zip(params, self.weights):
            local = local_part(p.detach())
            if local.shape != saved.data.shape:
                raise RuntimeError(f"a rollback point holds a {tuple(saved.data.shape)} part for {tuple(local.shape)}")
            local.copy_(saved.data)
        for p, saved in zip(params, self.optimizer):
            if saved is None:  # kept before this parameter's first step: it has no state yet
                optimizer.state.pop(p, None)
                continue
            state = optimizer.state[p]
            for k in [k for k in state if k not in saved]:
                del state[k]
            for k, v in saved.items():
                state[k] = v.put_into(state.get(k)) if isinstance(v, _Copy) else copy.deepcopy(v)
        if scheduler is not None and self.scheduler is not None:
            with rates_kept(optimizer, scheduler):
                scheduler.load_state_dict(copy.deepcopy(self.scheduler))
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state(self.cuda_rng, params[0].device)
        return self.global_step


class RollbackPoints:
    """The points one worker holds, by the step the driver named them with."""

    def __init__(self) -> None:
        self.points: dict[int, RollbackPoint] = {}

    def keep(
        self, step: int, keep: list[int], optimizer: torch.optim.Optimizer, scheduler: LambdaLR | None, global_step: int
    ) -> dict[str, float]:
        """Forget the points not in ``keep`` (first: never one more in memory than the driver counts on), then
        copy the state now as the point of ``step``. ``perf/worker_s``: the seconds it took."""
        t0 = time.perf_counter()
        for old in [s for s in self.points if s not in keep]:
            del self.points[old]
        self.points[step] = RollbackPoint(optimizer, scheduler, global_step)
        return {"perf/worker_s": time.perf_counter() - t0}

    def restore(self, step: int, optimizer: torch.optim.Optimizer, scheduler: LambdaLR | None) -> int:
        """Put the point of ``step`` back (``RollbackPoint.restore``); returns its update counter."""
        if step not in self.points:
            raise RuntimeError(
                f"no rollback point of step {step} is kept in this worker (kept: {sorted(self.points) or 'none'})"
            )
        return self.points[step].restore(optimizer, scheduler)
