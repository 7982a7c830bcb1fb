"""``trust_region``: keep each optimizer step's change of the policy within a trust region, in nats per token.

The guard reads ``policy_kl`` at stage ``step`` (right after ``optimizer.step`` in each actor worker):
the KL divergence between the policy before and after the step, on tokens the step was trained on
(``armor_core/workers/actor/policy_shift.py``). Unlike the weights' relative change, its scale does not depend
on the model, the task or the learning rate, so one default serves every run and protects from the
first step, before any history exists. Three regimes, relative to ``target_kl``:

* ``kl > skip_factor * target_kl``: the step is undone (``skip``: the worker puts the old weights back)
  and the learning rate is lowered. A step this large is what a collapse is made of: a learning rate
  ten times too high moves a small model's answers in one update.
* ``target_kl < kl``: the step stands and the learning rate is lowered.
* ``kl < recover_below * target_kl`` with the learning rate below the run's own: it is raised by
  ``recover_factor`` (never past the run's ``actor.lr``), so a cut made for a transient cause (a
  learning-rate spike, one bad batch) is given back once steps are small again.

The new learning rate: for a small step the KL is quadratic in its length (``KL ~ 1/2 d^T F d``, F the
Fisher information), and with Adam the step's length is proportional to the learning rate, so
``lr * sqrt(aim / kl)`` would have made this step's KL ``aim``; the guard aims at ``target_kl / 2``,
inside the band, so that one cut is usually enough. It is never lowered below ``min_lr_scale * lr``.
This is rsl_rl's adaptive learning rate (a desired KL, the rate moved by a fixed factor outside a band)
with the factor computed from how far out the step was, and PPO's trust region (Schulman et al. 2015)
enforced by undoing a step rather than by a line search.

A lowered rate is given back only up to a ceiling: when calm steps had raised it again and a step
overshoots, that rate is too high for this run (not an unlucky batch), and the new one becomes the most
the rate is raised to. Steps overshooting back to back (a burst of bad batches, a spike of the rate) say
nothing about the rate and leave the ceiling alone, so after a transient cause the run's own rate comes back.

What it costs: ``policy_kl`` is one forward of a few rows (``PROBE_ROWS``), and judging a step at all keeps a
copy of the parameters to put back. ``needs_at`` asks for it on every step of the first ``watch_steps``, of
the ``watch_steps`` after an overshoot and while the rate is lowered, and on one step in ``every``
otherwise; the worker adds every step taken at a higher rate than the last one judged.

The adjustments live in the actor workers' learning rate, which checkpoints save, and the guard's own
state (ceiling, steps since an overshoot) in the checkpoint's guard state, so a resumed run goes on with the
rate the guard had set.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from armor_core import Verdict, hookimpl
from armor_core.hookspecs import RegisterStabilityGuard
from armor_core.stability.helpers import check_param, finite_stat

__all__ = ["TrustRegionGuard"]

NAME = "trust_region"


class TrustRegionGuard:
    """Undo a step that moved the policy too far, and set the learning rate from how far it moved.

    :param target_kl: per-token KL (nats) between the policy before and after one optimizer step above
        which the learning rate is lowered. Measured on the built-in recipe: its steps move the policy
        1e-4 to 0.035 nats per token, the first (Adam's bias-corrected first step moves every weight by
        the full rate) the largest; at ten times its rate the first step moves it 0.46.
    :param skip_factor: a step whose KL is above ``skip_factor * target_kl`` is also undone.
    :param recover_below: a step whose KL is below ``recover_below * target_kl`` lets a lowered learning
        rate rise again.
    :param recover_factor: the learning rate is multiplied by this on each such step, up to ``lr``.
    :param min_lr_scale: the learning rate is never lowered below ``min_lr_scale * lr``.
    :param every: once the run is calm at its own learning rate, ``policy_kl`` is measured on one step in ``every``
        (each measurement costs a forward of a few rows); 1 measures every step.
    :param watch_steps: every step is measured for this many steps at the start and after each overshoot.
    :param lr: ``actor.lr`` of the run (filled in by the guard runner).
    """

    stages = ("step",)
    needs = ("policy_kl",)
    actions = {"step": ("skip", "adjust")}

    def __init__(
        self,
        target_kl: float = 0.05,
        skip_factor: float = 4.0,
        recover_below: float = 0.25,
        recover_factor: float = 1.2,
        min_lr_scale: float = 1e-3,
        every: int = 4,
        watch_steps: int = 20,
        lr: float = 1e-5,
    ) -> None:
        check_param(NAME, "target_kl", target_kl, gt=0)
        check_param(NAME, "skip_factor", skip_factor, ge=1)
        check_param(NAME, "recover_below", recover_below, ge=0, lt=1)
        check_param(NAME, "recover_factor", recover_factor, gt=1)
        check_param(NAME, "min_lr_scale", min_lr_scale, gt=0, le=1)
        check_param(NAME, "every", every, ge=1)
        check_param(NAME, "watch_steps", watch_steps, ge=0)
        check_param(NAME, "lr", lr, gt=0)
        self.target_kl, self.skip_factor = float(target_kl), float(skip_factor)
        self.recover_below, self.recover_factor = float(recover_below), float(recover_factor)
        self.lr, self.min_lr = float(lr), float(min_lr_scale) * float(lr)
        self.every, self.watch_steps = int(every), int(watch_steps)
        self.ceiling = self.lr  # how far calm steps may raise a lowered lr
        self.quiet = 0  # measured steps since the last overshoot
        self.last_lr = self.lr  # the lr the next step is taken with, as far as this guard knows

    def observe(self, stage: str, stats: Mapping[str, float], step: int) -> Verdict:
        kl, lr = finite_stat(stats, "policy_kl"), finite_stat(stats, "lr")
        if stage != "step" or kl is None or lr is None:  # a non-finite step is non_finite's to judge
            return Verdict.proceed()
        if kl > self.target_kl:
            return self._overshoot(kl, lr)
        self.quiet += 1
        self.last_lr = lr
        if kl < self.recover_below * self.target_kl:
            if lr < self.ceiling:
                new_lr = min(self.ceiling, lr * self.recover_factor)
                self.last_lr = new_lr
                return Verdict(
                    "adjust",
                    f"policy moved {kl:.3g} nats/token, under {self.recover_below * self.target_kl:.3g}; "
                    f"lr {lr:.3g} -> {new_lr:.3g} (up to {self.ceiling:.3g})",
                    signal=kl,
                    threshold=self.recover_below * self.target_kl,
                    adjustments={"lr": new_lr},
                )
        return Verdict.proceed()

    def _overshoot(self, kl: float, lr: float) -> Verdict:
        """A step above ``target_kl``: lower the lr, undo the step if far out, remember a raised lr that failed."""
        new_lr = max(self.min_lr, lr * math.sqrt(0.5 * self.target_kl / kl))
        if self.quiet > 0 and lr < self.lr:
            # steps since the last overshoot had (or could have) raised the lr again, and it overshot: this lr is
            # too high for the run, not unlucky, so it is not raised past the new value again
            self.ceiling = min(self.ceiling, new_lr)
        self.quiet = 0
        self.last_lr = min(lr, new_lr)
        undo = kl > self.skip_factor * self.target_kl
        cut = {"lr": new_lr} if new_lr < lr else {}
        if not undo and not cut:  # already at the floor: nothing left to do but let the step stand
            return Verdict.proceed()
        limit = self.skip_factor * self.target_kl if undo else self.target_kl
        return Verdict(
            "skip" if undo else "adjust",
            f"policy moved {kl:.3g} nats/token in one step (limit {limit:.3g})"
            f"{', step undone' if undo else ''}{f'; lr {lr:.3g} -> {new_lr:.3g}' if cut else ''}",
            signal=kl,
            threshold=limit,
            adjustments=cut,
        )

    def needs_at(self, step: int) -> bool:
        """Whether to measure ``policy_kl`` at ``step`` (it costs a forward): every step of the first ``watch_steps``,
        of the ``watch_steps`` after an overshoot, and while the lr is lowered; one step in ``every`` otherwise. (The
        worker also measures any step taken at a higher rate than the last measured one, see ``GuardedStep``.)"""
        return (
            step <= self.watch_steps
            or self.quiet < self.watch_steps
            or self.last_lr < self.lr
            or step % self.every == 0
        )

    def state_dict(self) -> dict[str, Any]:
        # the lr itself is the worker's, saved with the optimizer; these are what the guard knows of it
        return {"ceiling": self.ceiling, "quiet": self.quiet, "last_lr": self.last_lr}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        def finite(key: str) -> float:
            value = state.get(key)
            return float(value) if value is not None and math.isfinite(float(value)) else self.lr

        self.ceiling, self.last_lr = finite("ceiling"), finite("last_lr")
        self.quiet = int(state.get("quiet", 0))


@hookimpl
def armor_register_stability_guards(register: RegisterStabilityGuard) -> None:
    register(NAME, TrustRegionGuard)
