"""``update_size``: undo an optimizer step that moved the weights too far, and lower a learning rate that keeps doing
it.

A healthy update changes the weights by a small fraction of their size. This guard watches
stage ``step`` (right after ``optimizer.step`` in each actor worker), whose statistic
``update_ratio = ||theta_new - theta_old|| / ||theta_old||`` is taken over all parameters (and
all shards), so every rank sees the same number. Two tests, either of which can fire:

- *spike*: after ``warmup`` accepted steps, a ratio above ``spike_factor`` times the median of the
  last ``window`` accepted ratios is an outlier for this run (a learning-rate spike, a gradient the
  other guards let through): the verdict is ``skip``, and the worker puts the old weights back.
- *ceiling* (``max_ratio``, off by default): a ratio above ``max_ratio`` is too large for any run
  of this model, whatever its history; the learning rate is multiplied by ``max_ratio / ratio``
  (the rate that would have made this step exactly ``max_ratio``) or by ``lr_factor``, whichever
  is smaller (the verdict is ``adjust``, applied from the next update on, never below
  ``min_lr``), and a ratio above
  ``skip_factor * max_ratio`` is also undone. This catches a learning rate that is wrong from the
  first step, which a test against the run's own history cannot.

Why the ratio: with Adam each coordinate moves by about ``lr`` per step whatever the gradient's
scale (the first step moves every coordinate by exactly ``lr``), so ``||delta|| ~ lr * sqrt(N)``
and ``update_ratio ~ lr / rms(theta)``: the learning rate measured against the weights it moves.
This is the quantity LARS/LAMB's trust ratio bounds (You et al. 2017, 2019), and "keep updates
to ~1e-3 of the weights" is the usual rule of thumb for stable training.

Undoing a step restores the parameters only: the optimizer's moments keep the gradient they saw,
as after a step with learning rate 0. A spike enters the history as nothing; a ratio over the
ceiling enters it too (the ceiling is fixed, the spike test follows the run).
"""

from __future__ import annotations

import statistics
from typing import Any, Mapping

from armor_core import Verdict, hookimpl
from armor_core.hookspecs import RegisterStabilityGuard
from armor_core.stability.helpers import check_param, finite_stat

__all__ = ["UpdateSizeGuard"]

NAME = "update_size"


class UpdateSizeGuard:
    """Skip outlier optimizer steps; lower a learning rate whose steps are too large.

    :param spike_factor: a step more than this many times the recent median ratio is undone.
    :param window: recent accepted ratios kept for the median.
    :param warmup: accepted steps before the spike test may act.
    :param max_ratio: the largest ``update_ratio`` accepted without lowering the learning rate;
        None disables the ceiling.
    :param skip_factor: a ratio above ``skip_factor * max_ratio`` is undone as well.
    :param lr_factor: the learning rate is multiplied by at most this each time the ceiling is exceeded.
    :param min_lr: the learning rate is never lowered below this.
    """

    stages = ("step",)
    actions = {"step": ("skip", "adjust")}

    def __init__(
        self,
        spike_factor: float = 8.0,
        window: int = 50,
        warmup: int = 5,
        max_ratio: float | None = None,
        skip_factor: float = 4.0,
        lr_factor: float = 0.5,
        min_lr: float = 0.0,
    ) -> None:
        check_param(NAME, "spike_factor", spike_factor, gt=1)
        check_param(NAME, "window", window, ge=1)
        check_param(NAME, "warmup", warmup, ge=1)
        if warmup > window:
            raise ValueError(f"guard {NAME}: warmup={warmup} cannot exceed window={window} (the history is the window)")
        if max_ratio is not None:
            check_param(NAME, "max_ratio", max_ratio, gt=0)
        check_param(NAME, "skip_factor", skip_factor, gt=1)
        check_param(NAME, "lr_factor", lr_factor, gt=0, lt=1)
        check_param(NAME, "min_lr", min_lr, ge=0)
        self.spike_factor, self.window, self.warmup = float(spike_factor), int(window), int(warmup)
        self.max_ratio = None if max_ratio is None else float(max_ratio)
        self.skip_factor, self.lr_factor, self.min_lr = float(skip_factor), float(lr_factor), float(min_lr)
        self.recent: list[float] = []

    def observe(self, stage: str, stats: Mapping[str, float], step: int) -> Verdict:
        if stage != "step":
            return Verdict.proceed()
        r = finite_stat(stats, "update_ratio")
        if r is None:  # a non-finite step is non_finite's to judge
            return Verdict.proceed()
        if len(self.recent) >= self.warmup:
            median = statistics.median(self.recent)
            limit = self.spike_factor * median
            if median > 0 and r > limit:
                return Verdict(
                    "skip",
                    f"update_ratio {r:.3g} is {r / median:.1f}x the recent median {median:.3g}; step undone",
                    signal=r,
                    threshold=limit,
                )
        if self.max_ratio is not None and r > self.max_ratio:
            lr = finite_stat(stats, "lr")
            # the ratio is about proportional to lr, so lr * max_ratio / r would have made this step
            # exactly max_ratio: take that or lr * lr_factor, whichever is smaller
            adjustments = (
                {"lr": max(self.min_lr, lr * min(self.lr_factor, self.max_ratio / r))}
                if lr is not None and lr > self.min_lr
                else {}
            )
            ceiling = self.skip_factor * self.max_ratio
            undo = r > ceiling
            if not undo:
                self.recent = (self.recent + [r])[-self.window :]
            lowered = f"; lr {lr:.3g} -> {adjustments['lr']:.3g}" if adjustments else ""
            return Verdict(
                "skip" if undo else "adjust",
                f"update_ratio {r:.3g} is above max_ratio "
                f"{self.max_ratio:.3g}"
                f"{' x ' + format(self.skip_factor, 'g') + ', step undone' if undo else ''}{lowered}",
                signal=r,
                threshold=ceiling if undo else self.max_ratio,
                adjustments=adjustments,
            )
        self.recent = (self.recent + [r])[-self.window :]
        return Verdict.proceed()

    def state_dict(self) -> dict[str, Any]:
        return {"recent": list(self.recent)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.recent = [float(x) for x in state.get("recent", [])][-self.window :]


@hookimpl
def armor_register_stability_guards(register: RegisterStabilityGuard) -> None:
    register(NAME, UpdateSizeGuard)
