"""``expert_collapse``: roll back when an MoE model's routing falls towards a few experts, and lower the learning rate.

An MoE policy trained with RL can lose its load balance: the router learns to send most tokens to the experts that
scored well early, the others stop receiving tokens (and gradient), and the model is left with the capacity of a
few experts. The guard reads ``moe/load_entropy`` at stage ``update`` (``armor_core/models/moe.py``: the entropy of
each MoE layer's load over its experts divided by ``log E``, averaged over the layers; 1 is perfect balance, 0 one
expert). The scale is the same for every model, but a model's own balance is not (a warm start may already lean on
some experts), so the threshold is calibrated from the run's own first ``warmup`` updates: their median is the
baseline, and a value below ``baseline - max(min_drop, rel_drop * baseline)`` is a collapse. ``patience`` collapsed
updates in a row ask for a ``rollback`` to before the first of them, with the learning rate multiplied by
``lr_factor``: the same steps at the same rate would take the router the same way. The cut is kept (checkpointed
with the actor's optimizer) and logged in ``guard_events.jsonl``.

A run whose model has no router (no ``moe/*`` statistics) is never judged. ``armor run`` adds this guard to the
default stack when the model is an MoE model (``armor_core/loop/guard_defaults.py``); a ``guard.guards`` of the
user's own replaces the whole stack, this guard included.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping

from armor_core import Verdict, hookimpl
from armor_core.hookspecs import RegisterStabilityGuard
from armor_core.stability.helpers import check_param, finite_stat

__all__ = ["ExpertCollapseGuard"]

NAME = "expert_collapse"
KEY = "moe/load_entropy"


class ExpertCollapseGuard:
    """Roll back, with a lower learning rate, when the experts' load entropy falls far below the run's first updates'.

    :param warmup: updates whose load entropy sets the baseline (their median).
    :param rel_drop: a fall of this share of the baseline is a collapse (or ``min_drop``, the larger).
    :param min_drop: the smallest fall that counts, in normalised entropy (0 to 1).
    :param patience: collapsed updates in a row before a rollback.
    :param lr_factor: the learning rate is multiplied by this with every rollback.
    :param max_rollbacks: rollbacks after which the new level is accepted as the baseline.
    :param lr: ``actor.lr`` of the run (filled in by the guard runner).
    """

    stages = ("update",)
    actions = {"update": ("rollback",)}

    def __init__(
        self,
        warmup: int = 5,
        rel_drop: float = 0.3,
        min_drop: float = 0.1,
        patience: int = 2,
        lr_factor: float = 0.5,
        max_rollbacks: int = 3,
        lr: float = 1e-5,
    ) -> None:
        for name, value in (("warmup", warmup), ("patience", patience), ("max_rollbacks", max_rollbacks)):
            check_param(NAME, name, value, ge=1)
        check_param(NAME, "rel_drop", rel_drop, gt=0, lt=1)
        check_param(NAME, "min_drop", min_drop, ge=0, lt=1)
        check_param(NAME, "lr_factor", lr_factor, gt=0, le=1)
        check_param(NAME, "lr", lr, gt=0)
        self.warmup, self.patience, self.max_rollbacks = int(warmup), int(patience), int(max_rollbacks)
        self.rel_drop, self.min_drop, self.lr_factor, self.lr = float(rel_drop), float(min_drop), float(lr_factor), lr
        self.first: list[float] = []  # the first ``warmup`` values: the baseline
        self.low, self.rollbacks = 0, 0
        self.last_good: int | None = None

    def limit(self) -> tuple[float, float]:
        """``(baseline, the value below which an update counts as collapsed)``."""
        baseline = statistics.median(self.first)
        return baseline, baseline - max(self.min_drop, self.rel_drop * baseline)

    def observe(self, stage: str, stats: Mapping[str, float], step: int) -> Verdict:
        x = finite_stat(stats, KEY)
        if stage != "update" or x is None:
            return Verdict.proceed()
        if len(self.first) < self.warmup:
            self.first.append(x)
            self.last_good = step
            return Verdict.proceed()
        baseline, limit = self.limit()
        if x >= limit:
            self.low, self.last_good = 0, step
            return Verdict.proceed()
        self.low += 1
        if self.low < self.patience:
            return Verdict.proceed()
        self.low = 0
        if self.rollbacks >= self.max_rollbacks:
            self.first, self.rollbacks, self.last_good = [x] * self.warmup, 0, step
            return Verdict("proceed", f"{KEY} {x:.3g} fell again after {self.max_rollbacks} rollbacks; accepting it")
        self.rollbacks += 1
        self.lr *= self.lr_factor
        return Verdict(
            "rollback",
            f"{KEY} {x:.3g} is below {limit:.3g} (the first {self.warmup} updates' median {baseline:.3g}) for "
            f"{self.patience} updates in a row: the routing is collapsing onto few experts",
            signal=x,
            threshold=limit,
            adjustments={"lr": self.lr},
            since=self.last_good,  # its statistic was measured before its update: the weights of the updates since
        )

    def state_dict(self) -> dict[str, Any]:
        return {"first": list(self.first), "low": self.low, "rollbacks": self.rollbacks, "lr": self.lr,
                "last_good": self.last_good}  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.first = [float(v) for v in state.get("first", [])]
        self.low, self.rollbacks = int(state.get("low", 0)), int(state.get("rollbacks", 0))
        self.lr = float(state.get("lr", self.lr))
        self.last_good = state.get("last_good")


@hookimpl
def armor_register_stability_guards(register: RegisterStabilityGuard) -> None:
    register(NAME, ExpertCollapseGuard)
