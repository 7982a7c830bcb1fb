"""``trust_region``: keep each optimizer step's change of the policy within a trust region, in nats per token.

The guard reads ``policy_kl`` at stage ``step`` (right after ``optimizer.step`` in each actor worker):
the KL divergence between the policy before and after the step, on tokens the step was trained on
(``armor_core/workers/actor/policy_shift.py``). Unlike the weights' relative change, its scale does not depend
on the model, the task or the learning rate, so one default serves every run and protects from the
first step, before any history exists. Three regimes, relative to ``target_kl``:

* ``kl > skip_factor * target_kl``: the step is undone (``skip``: the worker puts the old weights back)
  and the learning rate is lowered. A step this large is what a collapse is made of: one step of 0.199
  nats/token (the code recipe at ten times its rate, its first) took the batch's score from 0.28 to 0.016.
  The optimizer steps taken on one batch (``actor.ppo_mini_batch_size`` and ``ppo_epochs`` make several)
  are held together too: those that stand may move the policy at most ``batch_factor * target_kl`` in all
  (the sum of their KLs stands for the batch's), and a step that would pass it is undone, like the rest
  of the batch's steps after it.
* ``target_kl < kl``: the step stands and the learning rate is lowered, except on the run's first optimizer
  step. AdamW's first step is a sign step (the bias-corrected moments are ``g`` and ``g**2``, so every weight
  moves by the full rate), the largest the run takes at its rate: ``recipe:cross_domain`` as shipped moves
  the policy 0.06 to 0.07 nats/token on it and 0.011 to 0.014 on the next two, so a cut made from it would
  lower the rate of a run with nothing wrong. A first step over the undo line is undone as any other.
* a batch whose steps together moved the policy less than ``recover_below * target_kl``, with the
  learning rate below the run's own: it is raised by ``recover_factor`` (never past the run's
  ``actor.lr``) at the next batch's first step, so a cut made for a transient cause (a learning-rate
  spike, one bad batch) is given back once the policy moves little again. The judgement is per batch,
  not per step: four steps of 0.006 nats/token on one batch move it as far as one of 0.024, and a rate
  raised on each of them climbed back from a cut to six times the code recipe's rate in five batches,
  each step calm, and that rate wore the policy down to no passing program.

The new learning rate: for a small step the KL is quadratic in its length (``KL ~ 1/2 d^T F d``, F the
Fisher information), and with Adam the step's length is proportional to the learning rate, so
``lr * sqrt(aim / kl)`` would have made this step's KL ``aim``; the guard aims at ``target_kl / 2``,
inside the band, so that one cut is usually enough. That holds near the band only: far out the KL
saturates (a token's probability cannot fall below zero), so an undone step says less about the rate
than its KL suggests (on the code recipe at ten times its rate, steps taken at the rate the square root
gave after an undone one moved the policy 4 to 10 times the aim). An undone step's cut is therefore
linear, ``lr * aim / kl``, but by at most ten times (``MAX_UNDO_CUT``): the next step that overshoots cuts it
further. The rate is never lowered below ``min_lr_scale * lr``.
This is rsl_rl's adaptive learning rate (a desired KL, the rate moved by a fixed factor outside a band)
with the factor computed from how far out the step was, and PPO's trust region (Schulman et al. 2015)
enforced by undoing a step rather than by a line search.

In a distillation run (``algorithm.distill``) the policy is pulled toward a fixed teacher, and a step
toward it is not a runaway: the probe also measures ``teacher_kl``, the policy's KL to the teacher on the
same tokens, and the target is at least ``TOWARD_TEACHER`` (a quarter) of it, which in distance is about
half the way (KL grows with the square). ``recipe:distill``'s first step moves the policy 0.46
nats/token with the teacher 3.2 away; held to ``target_kl`` alone, its steps were undone and its rate cut
until it ended 9 points lower (0.850 against 0.938, seed 1). Near the teacher the run's own
``target_kl`` holds again.

A lowered rate is given back only up to a ceiling: when calm steps had raised it again and a step
overshoots, that rate is too high for this run (not an unlucky batch), and the new one becomes the most
the rate is raised to. Steps overshooting back to back (a burst of bad batches, a spike of the rate) say
nothing about the rate and leave the ceiling alone, so after a transient cause the run's own rate comes back.

A calm step is judged on its own batch's tokens, and a rate several times the run's can wear the policy down in steps
each calm by that measure: ``recipe:tools`` at ten times its rate, cut to its own at the first step and given back to
2 to 3.6 times it, lost a third of its held-out accuracy within ten steps on half the seeds and all of it, for good, on
one (a batch scoring 0 everywhere has no advantage left to learn from). So the guard also watches validation
(``val/acc_greedy``, every ``trainer.val_freq`` steps): an accuracy far below the last good validation's
(``VAL_DROP``, ``VAL_REL_DROP``) while an update since then ran at a rate raised past the lowest the run has run at
is blamed on the raise. The run rolls back to that validation's weights (a rollback point, kept every
``guard.rollback_every`` steps, needs no checkpoint) and the rate goes back to that lowest one and is raised no
higher. Not to the last cut: on ``recipe:tools`` at ten times its rate a give-back that had climbed to 6x was cut
twice, to 2.6x, and a run rolled back to that rate ended at 0.625 (seed 3). The steps are judged in the actor
workers and validation in the driver, each by its own instance of this guard: the driver's follows the rate each
update ran at (``actor/lr`` at stage ``update``), and the workers' are told of the rate it sets (``adjusted``) and
take it as their ceiling. A run at its own rate, never cut, is
never rolled back for its validation, however it dips; a run without validation is not watched this way.

Two changes were tried on 2026-12-07 and not kept (``docs/stability.md`` has the figures). Judging the give-back
on the mean of the last four batches (a batch's KL varies tenfold at one rate) fixed the run that prompted it,
``reinforce_plus_plus_baseline`` at ten times the recipe's rate (seed 1: 0.402 to 0.70; seeds 1-3 0.707 on
average against 0.618), but slowed the recovery of short runs: ``recipe:code`` at ten times its rate, thirty
batches long, ended within 5 points of its clean mean on 2 of 10 seeds instead of 6 (0.806 on average against
0.870), and the arithmetic recipe at ten times (an undone step's batch counted in the four) on 9 of 10 instead
of 10.
Letting a ceiling rise again after 100 calm steps fired on 9 of 10 of those arithmetic runs and, where it fired
late (``lr_x10`` seed 6, ``reinforce_plus_plus_baseline`` seed 3), cost 8 and 12 points in the last steps: a calm
stretch at a rate says the policy is settled there, not that a higher rate is safe.

What it costs: ``policy_kl`` is one forward of a few rows (``PROBE_ROWS``), and judging a step at all keeps a copy
of the parameters to put back; watching validation keeps a rollback point every ``guard.rollback_every`` steps
(``armor_core/loop/rollback.py``: in host memory for a small model). ``needs_at`` asks for ``policy_kl`` on every
step of the first ``watch_steps``, of the ``watch_steps`` after an overshoot and while the rate is lowered, and on
one step in ``every`` otherwise; the worker adds every step taken at a higher rate than the last one judged.

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
#: the most one undone step cuts the rate by: it proves the rate too high, not by how much (one step of a code run
#: at the recipe's own rate moved the policy 4.9 nats/token, and a cut by 200 would have stopped it learning)
MAX_UNDO_CUT = 0.1
#: in a distillation run, the share of the policy's KL to the teacher one step may move it: a quarter in KL is about
#: half the way in distance (KL grows with its square), a step toward a fixed target that cannot overshoot it
TOWARD_TEACHER = 0.25
#: the validation statistic watched, and how far below the last good validation it must fall (the larger of an
#: absolute and a relative drop) for a raised rate to be blamed. A drop alone proves little: ``recipe:tools`` at its own
#: rate dips by up to 0.195 (31%) between two validations and recovers; at ten times it, with the rate given back to 2
#: to 3.6 times the recipe's, it fell by 0.18 to 0.68 (seed 6 to 0, for good), so only a raised rate is suspected
VAL_KEY, VAL_DROP, VAL_REL_DROP = "val/acc_greedy", 0.1, 0.25


class TrustRegionGuard:
    """Undo a step that moved the policy too far, and set the learning rate from how far it moved.

    :param target_kl: per-token KL (nats) between the policy before and after one optimizer step above
        which the learning rate is lowered. Measured on the built-in recipe: its steps move the policy
        1e-4 to 0.035 nats per token, the first (Adam's bias-corrected first step moves every weight by
        the full rate) the largest; at ten times its rate the first step moves it 0.46.
    :param skip_factor: a step whose KL is above ``skip_factor * target_kl`` is also undone.
    :param batch_factor: a step that would take the KLs of the steps standing on its batch past
        ``batch_factor * target_kl`` is undone.
    :param recover_below: a batch whose steps' KL sums to less than ``recover_below * target_kl`` lets a lowered
        learning rate rise again.
    :param recover_factor: the learning rate is multiplied by this after each such batch, up to ``lr``.
    :param min_lr_scale: the learning rate is never lowered below ``min_lr_scale * lr``.
    :param every: once the run is calm at its own learning rate, ``policy_kl`` is measured on one step in ``every``
        (each measurement costs a forward of a few rows); 1 measures every step.
    :param watch_steps: every step is measured for this many steps at the start and after each overshoot.
    :param lr: ``actor.lr`` of the run (filled in by the guard runner).
    """

    stages = ("step", "update", "validation")
    needs = ("policy_kl",)
    actions = {"step": ("skip", "adjust"), "validation": ("rollback",)}

    def __init__(
        self,
        target_kl: float = 0.05,
        skip_factor: float = 2.0,
        batch_factor: float = 4.0,
        recover_below: float = 0.25,
        recover_factor: float = 1.2,
        min_lr_scale: float = 1e-3,
        every: int = 4,
        watch_steps: int = 20,
        lr: float = 1e-5,
    ) -> None:
        check_param(NAME, "target_kl", target_kl, gt=0)
        check_param(NAME, "skip_factor", skip_factor, ge=1)
        check_param(NAME, "batch_factor", batch_factor, ge=1)
        check_param(NAME, "recover_below", recover_below, ge=0, lt=1)
        check_param(NAME, "recover_factor", recover_factor, gt=1)
        check_param(NAME, "min_lr_scale", min_lr_scale, gt=0, le=1)
        check_param(NAME, "every", every, ge=1)
        check_param(NAME, "watch_steps", watch_steps, ge=0)
        check_param(NAME, "lr", lr, gt=0)
        self.target_kl, self.skip_factor, self.batch_factor = float(target_kl), float(skip_factor), float(batch_factor)
        self.recover_below, self.recover_factor = float(recover_below), float(recover_factor)
        self.lr, self.min_lr = float(lr), float(min_lr_scale) * float(lr)
        self.every, self.watch_steps = int(every), int(watch_steps)
        self.ceiling = self.lr  # how far calm steps may raise a lowered lr
        self.quiet = 0  # measured steps since the last overshoot
        self.last_lr = self.lr  # the lr the next step is taken with, as far as this guard knows
        # the trainer step whose batch is being trained on, its standing steps' KL, whether none of them overshot
        self.batch_step, self.batch_kl, self.batch_calm = 0, 0.0, False
        self.judged = 0  # steps judged so far in this run (resumed with it)
        # the driver's instance, from the rate each update ran at (stage ``update``): the lowest so far, whether an
        # update since the last good validation ran above it, the last update's rate
        self.base, self.raised, self.prev_lr = self.lr, False, self.lr
        self.good_val: tuple[int, float] | None = None  # (step, accuracy) of the last validation judged good

    def observe(self, stage: str, stats: Mapping[str, float], step: int) -> Verdict:
        if stage == "update":  # the driver's instance: the rate each batch's update ran at
            self._ran_at(finite_stat(stats, "actor/lr"))
            return Verdict.proceed()
        if stage == "validation":
            return self._validation(finite_stat(stats, VAL_KEY), step)
        kl, lr = finite_stat(stats, "policy_kl"), finite_stat(stats, "lr")
        if stage != "step" or kl is None or lr is None:  # a non-finite step is non_finite's to judge
            return Verdict.proceed()
        target = self._target(finite_stat(stats, "teacher_kl"))
        sign_step = step == 1 and self.judged == 0  # AdamW's first step of the run (see the module docstring)
        self.judged += 1
        calm = self.recover_below * target
        give_back, last_batch = False, self.batch_kl
        if step != self.batch_step:  # the last batch is done: was it calm, all its steps together?
            give_back = self.batch_calm and last_batch < calm
            self.batch_step, self.batch_kl, self.batch_calm = step, 0.0, True
        if kl > target or self.batch_kl + kl > self.batch_factor * target:
            self.batch_calm = False
            if not (sign_step and kl <= self.skip_factor * target):
                return self._overshoot(kl, lr, target)
        self.batch_kl += kl
        self.quiet += 1
        self.last_lr = lr
        if give_back and lr < self.ceiling:
            new_lr = min(self.ceiling, lr * self.recover_factor)
            self.last_lr = new_lr
            return Verdict(
                "adjust",
                f"the last batch moved the policy {last_batch:.3g} nats/token, all its steps together, under "
                f"{calm:.3g}; lr {lr:.3g} -> {new_lr:.3g} (up to {self.ceiling:.3g})",
                signal=last_batch,
                threshold=calm,
                adjustments={"lr": new_lr},
            )
        return Verdict.proceed()

    def adjusted(self, adjustments: Mapping[str, float]) -> None:
        """In the worker: a rate set by the driver (this guard's rollback for a validation, or another guard's cut) is
        the most calm batches give back from now on."""
        if "lr" in adjustments:
            lr = float(adjustments["lr"])
            self.ceiling, self.last_lr, self.quiet = min(self.ceiling, lr), lr, 0

    def _ran_at(self, lr: float | None) -> None:
        """In the driver: a batch's update ran at ``lr``; the lowest rate so far is ``base``, a higher one a raise."""
        if lr is None:
            return
        self.base = min(self.base, lr)
        self.raised = self.raised or lr > self.base
        self.prev_lr = lr

    def _validation(self, acc: float | None, step: int) -> Verdict:
        """A validation: if its accuracy fell far below the last good one while the rate ran raised past the last
        cut, roll back to the weights of that validation and hold the rate at the cut (see the module docstring)."""
        if acc is None:
            return Verdict.proceed()
        good = self.good_val
        if good is not None and self.raised:
            limit = good[1] - max(VAL_DROP, VAL_REL_DROP * good[1])
            if acc < limit:
                was, self.prev_lr, self.raised = self.prev_lr, self.base, False
                return Verdict(
                    "rollback",
                    f"{VAL_KEY} {acc:.3g} fell below {limit:.3g} (step {good[0]}: {good[1]:.3g}) while updates ran at "
                    f"rates raised past the lowest it ran at, {self.base:.3g}; rolled back to step {good[0]}'s "
                    f"weights, lr {was:.3g} -> {self.base:.3g}, no higher from now on",
                    signal=acc,
                    threshold=limit,
                    adjustments={"lr": self.base},
                    since=good[0] + 1,
                )
        self.good_val = (step, acc)
        self.raised = self.prev_lr > self.base
        return Verdict.proceed()

    def _target(self, teacher_kl: float | None) -> float:
        """``target_kl``; in a distillation run, at least ``TOWARD_TEACHER`` of the policy's KL to the teacher."""
        return self.target_kl if teacher_kl is None else max(self.target_kl, TOWARD_TEACHER * teacher_kl)

    def _overshoot(self, kl: float, lr: float, target: float) -> Verdict:
        """A step above the target, or past the batch's budget: lower the lr, undo the step if far out (alone or with
        the batch's steps before it), remember a raised lr that failed."""
        alone = kl > self.skip_factor * target  # undone for itself, or for its batch's budget
        undo = alone or self.batch_kl + kl > self.batch_factor * target
        if not undo:
            self.batch_kl += kl
        aim = 0.5 * target
        new_lr = max(self.min_lr, lr * (max(MAX_UNDO_CUT, aim / kl) if undo else math.sqrt(aim / kl)))
        if self.quiet > 0 and lr < self.lr:
            # steps since the last overshoot had (or could have) raised the lr again, and it overshot: this lr is
            # too high for the run, not unlucky, so it is not raised past the new value again
            self.ceiling = min(self.ceiling, new_lr)
        self.quiet = 0
        self.last_lr = min(lr, new_lr)
        cut = {"lr": new_lr} if new_lr < lr else {}
        if not undo and not cut:  # already at the floor: nothing left to do but let the step stand
            return Verdict.proceed()
        for_batch = undo and not alone
        limit = (self.skip_factor if alone else self.batch_factor) * target if undo else target
        batch = f", {self.batch_kl + kl:.3g} with this batch's steps before it" if for_batch else ""
        return Verdict(
            "skip" if undo else "adjust",
            f"policy moved {kl:.3g} nats/token in one step{batch} (limit {limit:.3g})"
            f"{', step undone' if undo else ''}{f'; lr {lr:.3g} -> {new_lr:.3g}' if cut else ''}",
            signal=self.batch_kl + kl if for_batch else kl,
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
        return {
            "ceiling": self.ceiling,
            "quiet": self.quiet,
            "last_lr": self.last_lr,
            "batch_step": self.batch_step,
            "batch_kl": self.batch_kl,
            "batch_calm": self.batch_calm,
            "judged": self.judged,
            "base": self.base,
            "raised": self.raised,
            "prev_lr": self.prev_lr,
            "good_val": list(self.good_val) if self.good_val else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        def finite(key: str) -> float:
            value = state.get(key)
            return float(value) if value is not None and math.isfinite(float(value)) else self.lr

        self.ceiling, self.last_lr = finite("ceiling"), finite("last_lr")
        self.quiet = int(state.get("quiet", 0))
        self.batch_step, self.batch_kl = int(state.get("batch_step", 0)), float(state.get("batch_kl", 0.0))
        self.batch_calm = bool(state.get("batch_calm", False))
        self.judged = int(state.get("judged", 1))  # a checkpoint from before this key was saved after its first step
        self.base, self.prev_lr, self.raised = finite("base"), finite("prev_lr"), bool(state.get("raised", False))
        good = state.get("good_val")
        self.good_val = (int(good[0]), float(good[1])) if good else None


@hookimpl
def armor_register_stability_guards(register: RegisterStabilityGuard) -> None:
    register(NAME, TrustRegionGuard)
