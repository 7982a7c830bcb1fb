"""Helpers for writing a stability guard: reading a statistic safely, running moments, bounded knobs.

Public (a plugin may import this module, ``tests/test_layering.py``): the built-in guards in
``armor_plugins.guards`` are written with these and nothing else, and a third-party guard can be too::

    from armor_core.stability.helpers import Knob, RunningMoments, check_param, commit, finite_stat

What a guard keeps between steps should live in one of these objects or in plain ints, so that its
``state_dict`` is JSON-able (the actor worker writes guard state with ``json.dumps``) and never holds a
NaN. This module imports nothing but the standard library: it runs in the driver and on the actor ranks.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

__all__ = ["Knob", "RunningMoments", "check_param", "commit", "finite_stat", "format_changes"]


def finite_stat(stats: Mapping[str, Any], key: str) -> float | None:
    """``stats[key]`` as a float if it is present and finite, else None.

    Non-finite values are the ``non_finite`` guard's business; every other guard treats them as
    "no observation", so a NaN never reaches a running statistic.
    """
    v = stats.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        try:  # 0-d tensors and numpy scalars
            v = float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
    v = float(v)
    return v if math.isfinite(v) else None


def check_param(
    guard: str,
    name: str,
    value: float,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> None:
    """Raise a ValueError naming the guard, the parameter, its value and the allowed range."""
    v = float(value)
    bad = None
    if not math.isfinite(v):
        bad = "a finite number"
    elif ge is not None and v < ge:
        bad = f">= {ge}"
    elif gt is not None and v <= gt:
        bad = f"> {gt}"
    elif le is not None and v > le:
        bad = f"<= {le}"
    elif lt is not None and v >= lt:
        bad = f"< {lt}"
    if bad:
        raise ValueError(f"guard {guard}: parameter {name}={value!r} must be {bad} (guard.guards[].params.{name})")


class RunningMoments:
    """Mean and variance of a stream: exact for the first ``window`` values, then an EMA.

    The n-th update uses weight ``alpha_n = max(1/n, 1/window)`` with the incremental form of
    West (1979) / Finch (2009, "Incremental calculation of weighted mean and variance", eq. 143)::

        delta = x - mean;  mean += alpha * delta;  var = (1 - alpha) * (var + alpha * delta**2)

    With ``alpha = 1/n`` this is Welford's algorithm for the population variance, so after ``n <=
    window`` values ``mean``/``var`` are exactly those of the values seen (hand-checkable); after
    that old values fade with weight ``(1 - 1/window)`` per step. An update that would overflow
    (a finite 1e300) is dropped, so the moments stay finite.
    """

    def __init__(self, window: int) -> None:
        self.window = int(window)
        self.n = 0
        self.mean = 0.0
        self.var = 0.0

    @property
    def std(self) -> float:
        """The standard deviation, ``sqrt(var)``."""
        return math.sqrt(self.var)

    def update(self, x: float) -> None:
        """Take one finite value (pass what :func:`finite_stat` returned, skipping None)."""
        alpha = max(1.0 / (self.n + 1), 1.0 / self.window)
        delta = x - self.mean
        mean = self.mean + alpha * delta
        var = (1.0 - alpha) * (self.var + alpha * delta * delta)
        if math.isfinite(mean) and math.isfinite(var):
            self.n, self.mean, self.var = self.n + 1, mean, var

    def state_dict(self) -> dict[str, Any]:
        """``{"n", "mean", "var"}``, JSON-able; a missing key loads as the empty stream's value."""
        return {"n": self.n, "mean": self.mean, "var": self.var}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.n = int(state.get("n", 0))
        self.mean = float(state.get("mean", 0.0))
        self.var = float(state.get("var", 0.0))


class Knob:
    """A training coefficient a guard may change (``lr``, ``clip_ratio_high``, ...), kept in ``[lo, hi]``.

    The guard cannot read the trainer's current value, so it starts from ``initial`` (the config's
    value, passed as a guard parameter) and tracks what it set itself.
    """

    def __init__(self, name: str, initial: float, lo: float, hi: float) -> None:
        self.name = name
        self.initial = float(initial)
        # a bound the initial value already violates would make the first change a jump
        self.lo = min(float(lo), self.initial)
        self.hi = max(float(hi), self.initial)
        self.value = self.initial

    def propose(self, value: float) -> float:
        """``value`` clipped to the bounds (does not change the knob)."""
        return min(max(value, self.lo), self.hi)

    def state_dict(self) -> float:
        """The current value (a float: JSON-able)."""
        return self.value

    def load_state_dict(self, value: Any) -> None:
        """Restore the value :meth:`state_dict` returned, clipped to the bounds (None or non-finite: ignored)."""
        if value is not None and math.isfinite(float(value)):
            self.value = self.propose(float(value))


def commit(knobs: Mapping[str, Knob], proposals: Mapping[str, float]) -> dict[str, float]:
    """Clip each proposal to its knob's bounds, set the knobs, return ``{name: new value}`` of those that moved.

    An empty result means every knob was already at the bound the guard pushed it towards: the guard
    then has nothing left to do and says ``proceed`` rather than logging an adjustment that changes nothing.
    """
    changed = {}
    for name, value in proposals.items():
        knob = knobs[name]
        new = knob.propose(value)
        if new != knob.value:
            knob.value = new
            changed[name] = new
    return changed


def format_changes(changed: Mapping[str, float]) -> str:
    """``{"lr": 1.5e-05}`` -> ``"lr -> 1.5e-05"`` for a verdict's reason."""
    return ", ".join(f"{k} -> {v:.4g}" for k, v in changed.items())
