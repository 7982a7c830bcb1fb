"""``reward_collapse``: roll back when the reward or the validation accuracy falls far below its recent level.

Two signals, each with its own history: the batch's mean reward (``score/mean`` at stage
``reward``) and the greedy validation accuracy (``val/acc_greedy`` at stage ``validation``).
For each, the guard keeps the last ``window`` accepted values. After ``warmup`` of them, a value is
a *collapse* when it is below ``baseline - drop`` with

    baseline = median(recent values)
    spread   = 1.4826 * median(|recent - baseline|)      (the MAD, scaled to estimate a std)
    drop     = max(min_drop, rel_drop * |baseline|, z * spread)

``patience`` collapsed values in a row ask for a ``rollback``. Median and MAD rather than mean and
std, because the history must not be dragged down by the few low batches that precede a collapse
(Hampel's robust location/scale; 1.4826 = 1/Phi^-1(3/4) makes the MAD consistent for a normal
std). The three terms of ``drop`` each stop a different false alarm: ``z * spread`` ordinary
batch-to-batch noise, ``rel_drop * |baseline|`` a drop that is small relative to the level,
``min_drop`` a zero-noise history (all-equal rewards give spread 0).

A rollback names the first suspected update (``Verdict.since``: the one after the weights that
produced the last good value), so the trainer restores a checkpoint from before the collapse began,
not one written while it was already under way.

A collapsed value is kept out of the history, so the baseline remembers the level before the
collapse; after the rollback the restored policy is measured against it again. A run whose reward
legitimately settles lower (a harder curriculum) would otherwise roll back forever: after
``max_rollbacks`` rollbacks for one signal the guard accepts the new level (the history restarts
from the current value) and says so in the verdict it returns, ``proceed``.
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping

from armor_core import Verdict, hookimpl
from armor_core.hookspecs import RegisterStabilityGuard
from armor_core.stability.helpers import check_param, finite_stat

__all__ = ["RewardCollapseGuard"]

NAME = "reward_collapse"

#: 1 / Phi^-1(3/4): the MAD of a normal sample times this estimates its standard deviation
MAD_TO_STD = 1.4826


class _Track:
    """The history of one signal."""

    def __init__(self, key: str, window: int, warmup: int, patience: int, lag: int) -> None:
        self.key, self.window, self.warmup, self.patience = key, window, warmup, patience
        # a value seen at step s measures the weights of update s - lag (a batch reward is
        # sampled before its step's update, a validation runs after it)
        self.lag = lag
        self.last_good: int | None = None  # step of the last value that was not a collapse
        self.recent: list[float] = []
        self.low = 0  # collapsed values in a row
        self.rollbacks = 0

    def state_dict(self) -> dict[str, Any]:
        return {"recent": list(self.recent), "low": self.low, "rollbacks": self.rollbacks, "last_good": self.last_good}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.recent = [float(x) for x in state.get("recent", [])][-self.window :]
        self.low = int(state.get("low", 0))
        self.rollbacks = int(state.get("rollbacks", 0))
        self.last_good = state.get("last_good")

    def accept(self, x: float, step: int) -> None:
        self.recent = (self.recent + [x])[-self.window :]
        self.low, self.last_good = 0, step

    def suspect_since(self) -> int | None:
        """The first update whose weights may be bad: the one after those of the last good value."""
        return None if self.last_good is None else self.last_good - self.lag + 1


class RewardCollapseGuard:
    """Roll back when the mean reward or the validation accuracy collapses.

    :param window: recent batch rewards kept for the baseline.
    :param warmup: batch rewards seen before the guard may act.
    :param patience: collapsed batch rewards in a row before a rollback (one bad batch of hard
        prompts is not a collapse).
    :param val_window: recent validation accuracies kept for the baseline.
    :param val_warmup: validations seen before the guard may act on validation.
    :param val_patience: collapsed validations in a row before a rollback (a validation runs on the
        whole held-out set, so one is already a reliable measurement).
    :param min_drop: the smallest drop below the baseline that counts (reward units).
    :param rel_drop: drops smaller than this fraction of ``|baseline|`` do not count.
    :param z: drops smaller than ``z`` robust standard deviations of the history do not count.
    :param max_rollbacks: rollbacks per signal after which a lower level is accepted.
    :param lr: the run's learning rate (``actor.lr``); needed only with ``rollback_lr_factor``.
    :param rollback_lr_factor: multiply the learning rate by this with every rollback (1 keeps it).
        Restoring the weights and taking the same steps again usually repeats the collapse; a
        smaller step is the one change that makes the second attempt different.
    :param min_lr: the learning rate is never cut below this.
    :param reward_key: the statistic read at stage ``reward``.
    :param val_key: the statistic read at stage ``validation``.
    """

    actions = {"reward": ("rollback",), "validation": ("rollback",)}

    def __init__(
        self,
        window: int = 20,
        warmup: int = 10,
        patience: int = 3,
        val_window: int = 5,
        val_warmup: int = 2,
        val_patience: int = 1,
        min_drop: float = 0.1,
        rel_drop: float = 0.3,
        z: float = 4.0,
        max_rollbacks: int = 3,
        lr: float | None = None,
        rollback_lr_factor: float = 1.0,
        min_lr: float = 0.0,
        reward_key: str = "score/mean",
        val_key: str = "val/acc_greedy",
    ) -> None:
        for name, value in (
            ("window", window),
            ("warmup", warmup),
            ("patience", patience),
            ("val_window", val_window),
            ("val_warmup", val_warmup),
            ("val_patience", val_patience),
        ):
            check_param(NAME, name, value, ge=1)
        if warmup > window or val_warmup > val_window:
            raise ValueError(
                f"guard {NAME}: warmup={warmup} and val_warmup={val_warmup} cannot exceed window={window} and "
                f"val_window={val_window} (the history is the window)"
            )
        check_param(NAME, "min_drop", min_drop, ge=0)
        check_param(NAME, "rel_drop", rel_drop, ge=0)
        check_param(NAME, "z", z, ge=0)
        check_param(NAME, "max_rollbacks", max_rollbacks, ge=1)
        self.min_drop, self.rel_drop, self.z = float(min_drop), float(rel_drop), float(z)
        self.max_rollbacks = int(max_rollbacks)
        check_param(NAME, "rollback_lr_factor", rollback_lr_factor, gt=0, le=1)
        if rollback_lr_factor < 1 and not (lr and lr > 0):
            raise ValueError(
                f"guard {NAME}: rollback_lr_factor={rollback_lr_factor} needs lr= (the run's actor.lr) to know what "
                "to cut"
            )
        self.lr, self.rollback_lr_factor, self.min_lr = (
            (float(lr) if lr else None),
            float(rollback_lr_factor),
            float(min_lr),
        )
        self.tracks = {
            "reward": _Track(str(reward_key), int(window), int(warmup), int(patience), lag=1),
            "validation": _Track(str(val_key), int(val_window), int(val_warmup), int(val_patience), lag=0),
        }

    def limit(self, recent: list[float]) -> tuple[float, float]:
        """``(baseline, baseline - drop)`` of a history (see the module docstring)."""
        baseline = statistics.median(recent)
        spread = MAD_TO_STD * statistics.median(abs(x - baseline) for x in recent)
        drop = max(self.min_drop, self.rel_drop * abs(baseline), self.z * spread)
        return baseline, baseline - drop

    def observe(self, stage: str, stats: Mapping[str, float], step: int) -> Verdict:
        track = self.tracks.get(stage)
        if track is None:
            return Verdict.proceed()
        x = finite_stat(stats, track.key)
        if x is None:
            return Verdict.proceed()
        if len(track.recent) < track.warmup:
            track.accept(x, step)
            return Verdict.proceed()
        baseline, limit = self.limit(track.recent)
        if not x < limit:
            track.accept(x, step)
            return Verdict.proceed()
        track.low += 1
        if track.low < track.patience:
            return Verdict.proceed()
        track.low = 0
        if track.rollbacks >= self.max_rollbacks:
            track.recent, track.rollbacks, track.last_good = [x], 0, step
            return Verdict(
                "proceed",
                f"{track.key} {x:.4g} collapsed again after {self.max_rollbacks} rollbacks; accepting it as the new "
                "level",
                signal=x,
                threshold=limit,
            )
        track.rollbacks += 1
        adjustments = {}
        if self.lr is not None and self.rollback_lr_factor < 1:
            self.lr = max(self.min_lr, self.lr * self.rollback_lr_factor)
            adjustments = {"lr": self.lr}
        return Verdict(
            "rollback",
            f"{track.key} {x:.4g} is below {limit:.4g} (recent median {baseline:.4g}) for {track.patience} {stage} "
            "stage(s) in a row",
            signal=x,
            threshold=limit,
            adjustments=adjustments,
            since=track.suspect_since(),
        )

    def state_dict(self) -> dict[str, Any]:
        return {**{stage: t.state_dict() for stage, t in self.tracks.items()}, "lr": self.lr}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for stage, t in self.tracks.items():
            t.load_state_dict(state.get(stage, {}))
        if state.get("lr") is not None:
            self.lr = float(state["lr"])


@hookimpl
def armor_register_stability_guards(register: RegisterStabilityGuard) -> None:
    register(NAME, RewardCollapseGuard)
