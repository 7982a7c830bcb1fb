"""``non_finite``: NaN or Inf anywhere in a stage's statistics skips the update; K in a row roll back.

Checked signals are whatever the stage reports (loss, grad_norm, log-prob and reward statistics,
advantage statistics). Skipping costs one batch; applying a non-finite update costs the run, since
one NaN in a weight spreads to every activation on the next forward.

A step counts once however many of its stages are non-finite, and a step whose ``update`` stage is
clean resets the count. Where the update can still be held back (stages ``reward``, ``advantage``,
``grad``) the verdict is ``skip``, or ``rollback`` once ``max_consecutive`` steps in a row were
non-finite. At ``update`` and ``validation`` the update is already made, so there is nothing to skip:
a non-finite statistic there (usually the echo of a gradient the ``grad`` stage already skipped)
counts towards the streak and asks for the ``rollback`` only when the streak is complete, which the
driver carries out (a worker's ``rollback`` at ``grad`` is only a skip).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from armor_core import Verdict, hookimpl
from armor_core.hookspecs import RegisterStabilityGuard

#: the stages where the update can still be skipped
_BEFORE_UPDATE = ("reward", "advantage", "grad")


class NonFiniteGuard:
    """:param max_consecutive: non-finite steps in a row before asking for a rollback."""

    actions = {
        **{stage: ("skip", "rollback") for stage in _BEFORE_UPDATE},
        "update": ("rollback",),
        "validation": ("rollback",),
    }

    def __init__(self, max_consecutive: int = 3) -> None:
        if max_consecutive < 1:
            raise ValueError(f"max_consecutive must be >= 1, got {max_consecutive}")
        self.max_consecutive = max_consecutive
        self.consecutive = 0
        self._last_bad_step: int | None = None

    def observe(self, stage: str, stats: Mapping[str, float], step: int) -> Verdict:
        bad = sorted(k for k, v in stats.items() if isinstance(v, (int, float)) and not math.isfinite(v))
        if not bad:
            if stage == "update" and self._last_bad_step != step:
                self.consecutive = 0  # a whole step went through clean
            return Verdict.proceed()
        if self._last_bad_step != step:
            self.consecutive += 1
            self._last_bad_step = step
        reason = f"non-finite {', '.join(bad)} at stage {stage}"
        if self.consecutive >= self.max_consecutive:
            return Verdict(
                "rollback",
                reason + f" ({self.consecutive} steps in a row)",
                signal=float(self.consecutive),
                threshold=float(self.max_consecutive),
            )
        if stage not in _BEFORE_UPDATE:
            return Verdict.proceed()  # the update is made: nothing to skip, and the streak is not complete
        return Verdict("skip", reason, signal=float(self.consecutive), threshold=float(self.max_consecutive))

    def state_dict(self) -> dict[str, Any]:
        return {"consecutive": self.consecutive}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.consecutive = int(state.get("consecutive", 0))


@hookimpl
def armor_register_stability_guards(register: RegisterStabilityGuard) -> None:
    register("non_finite", NonFiniteGuard)
