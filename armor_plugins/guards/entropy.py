"""``entropy``: keep the policy's token entropy between a floor (collapse) and a ceiling (explosion).

At stage ``update`` the guard reads ``actor/entropy``, the mean per-token entropy (nats) of the
policy on the batch.

* Below ``floor`` for ``patience`` updates in a row the policy is collapsing onto a few answers
  and stops exploring, after which the reward curve flattens (Cui et al. 2025, "The Entropy
  Mechanism of Reinforcement Learning for Reasoning Language Models"). The guard applies the first
  of ``remedies`` that is not at its bound yet: ``entropy_coeff`` (raise the entropy bonus by
  ``coeff_step``, up to ``max_entropy_coeff``) or ``clip_ratio_high`` (widen the upper clip by
  ``clip_step``, up to ``max_clip_ratio_high``; DAPO's clip-higher, Yu et al. 2025, which lets
  low-probability tokens gain mass; DAPO uses 0.28).
* Above ``ceiling`` for ``patience`` updates in a row the policy is drifting towards uniform
  noise; the guard takes back what it gave: ``entropy_coeff`` down by ``coeff_step`` (not below
  0) and ``clip_ratio_high`` back by ``clip_step`` (not below its initial value).

Steps are additive because the entropy bonus usually starts at 0 (``actor.entropy_coeff``), which
no factor can raise. Nothing is undone while the entropy is in the band: lowering the bonus as
soon as the entropy recovers would reopen the collapse it stopped.
"""

from __future__ import annotations

from typing import Any, Mapping

from armor_core import Verdict, hookimpl
from armor_core.hookspecs import RegisterStabilityGuard
from armor_core.stability.helpers import Knob, check_param, commit, finite_stat, format_changes

__all__ = ["EntropyGuard"]

NAME = "entropy"
REMEDIES = ("entropy_coeff", "clip_ratio_high")


class EntropyGuard:
    """Raise the entropy bonus (or widen the upper clip) on collapse; lower it on explosion.

    :param floor: mean token entropy (nats) below which the policy is collapsing.
    :param ceiling: mean token entropy above which it is exploding (None: never).
    :param patience: updates in a row beyond a bound before an adjustment.
    :param remedies: what to raise on collapse, first that still can: ``entropy_coeff``,
        ``clip_ratio_high``.
    :param coeff_step: ``entropy_coeff`` change per adjustment.
    :param max_entropy_coeff: ``entropy_coeff`` is never raised beyond this.
    :param clip_step: ``clip_ratio_high`` change per adjustment.
    :param max_clip_ratio_high: ``clip_ratio_high`` is never widened beyond this.
    :param entropy_coeff: ``actor.entropy_coeff`` of the run (the guard's starting point).
    :param clip_ratio_high: ``actor.clip_ratio_high`` of the run.
    """

    actions = {"update": ("adjust",)}

    def __init__(
        self,
        floor: float = 0.05,
        ceiling: float | None = 5.0,
        patience: int = 3,
        remedies: list[str] | tuple[str, ...] = REMEDIES,
        coeff_step: float = 1e-3,
        max_entropy_coeff: float = 0.01,
        clip_step: float = 0.02,
        max_clip_ratio_high: float = 0.28,
        entropy_coeff: float = 0.0,
        clip_ratio_high: float = 0.2,
    ) -> None:
        check_param(NAME, "floor", floor, ge=0)
        if ceiling is not None:
            check_param(NAME, "ceiling", ceiling, gt=floor)
        check_param(NAME, "patience", patience, ge=1)
        check_param(NAME, "coeff_step", coeff_step, gt=0)
        check_param(NAME, "max_entropy_coeff", max_entropy_coeff, ge=0)
        check_param(NAME, "clip_step", clip_step, gt=0)
        check_param(NAME, "max_clip_ratio_high", max_clip_ratio_high, ge=0)
        check_param(NAME, "entropy_coeff", entropy_coeff, ge=0)
        check_param(NAME, "clip_ratio_high", clip_ratio_high, ge=0)
        remedies = [str(r) for r in remedies]
        unknown = [r for r in remedies if r not in REMEDIES]
        if unknown or not remedies:
            raise ValueError(f"guard {NAME}: remedies={remedies} must be a non-empty list drawn from {list(REMEDIES)}")
        self.floor = float(floor)
        self.ceiling = None if ceiling is None else float(ceiling)
        self.patience = int(patience)
        self.remedies = remedies
        self.steps = {"entropy_coeff": float(coeff_step), "clip_ratio_high": float(clip_step)}
        self.knobs = {
            "entropy_coeff": Knob("entropy_coeff", entropy_coeff, 0.0, max_entropy_coeff),
            "clip_ratio_high": Knob("clip_ratio_high", clip_ratio_high, clip_ratio_high, max_clip_ratio_high),
        }
        self.low = 0  # updates in a row below the floor
        self.high = 0  # updates in a row above the ceiling

    def observe(self, stage: str, stats: Mapping[str, float], step: int) -> Verdict:
        if stage != "update":
            return Verdict.proceed()
        h = finite_stat(stats, "actor/entropy")
        if h is None:
            return Verdict.proceed()
        k = self.knobs
        if h < self.floor:
            self.low, self.high = self.low + 1, 0
            if self.low < self.patience:
                return Verdict.proceed()
            self.low = 0
            name = next((r for r in self.remedies if k[r].value < k[r].hi), None)
            if name is None:
                return Verdict.proceed()  # every remedy at its maximum
            changed = commit(k, {name: k[name].value + self.steps[name]})
            return Verdict(
                "adjust",
                f"actor/entropy {h:.4g} below the floor {self.floor:g} for {self.patience} updates (collapse): "
                f"{format_changes(changed)}",
                signal=h,
                threshold=self.floor,
                adjustments=changed,
            )
        if self.ceiling is not None and h > self.ceiling:
            self.low, self.high = 0, self.high + 1
            if self.high < self.patience:
                return Verdict.proceed()
            self.high = 0
            changed = commit(k, {n: k[n].value - self.steps[n] for n in REMEDIES})
            if not changed:
                return Verdict.proceed()  # nothing the guard or the config added is left to take back
            return Verdict(
                "adjust",
                f"actor/entropy {h:.4g} above the ceiling {self.ceiling:g} for {self.patience} updates (explosion): "
                f"{format_changes(changed)}",
                signal=h,
                threshold=self.ceiling,
                adjustments=changed,
            )
        self.low = self.high = 0
        return Verdict.proceed()

    def state_dict(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, **{n: knob.state_dict() for n, knob in self.knobs.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.low = int(state.get("low", 0))
        self.high = int(state.get("high", 0))
        for name, knob in self.knobs.items():
            knob.load_state_dict(state.get(name))


@hookimpl
def armor_register_stability_guards(register: RegisterStabilityGuard) -> None:
    register(NAME, EntropyGuard)
