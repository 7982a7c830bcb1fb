"""``importance_ratio``: when the policy runs away from the behaviour policy, take smaller steps.

At stage ``update`` the policy loss reports how far the new policy moved from the old one within
the last update: the fraction of tokens the PPO clip cut off (``actor/pg_clipfrac`` above ``1 +
eps_high`` plus ``actor/pg_clipfrac_lower`` below ``1 - eps_low``) and the extreme token ratios
(``actor/ratio_max``, ``actor/ratio_min``). One high value is noise; ``patience`` updates in a row
with any of them beyond its threshold mean each update overshoots the trust region. The guard then
``adjust``s: the clip range is tightened (both ``clip_ratio_low`` and ``clip_ratio_high`` times
``tighten_factor``, not below ``clip_ratio_floor``) and the learning rate is lowered (times
``lr_factor``, not below ``min_lr_scale * lr``); the streak then starts again, so the next cut
needs another ``patience`` bad updates.

When things are calm again (``recover_every`` calm updates in a row) one cut is undone per
``recover_every`` calm updates (divide by the same factor, never beyond the initial values), so a
transient excursion does not slow the rest of the run. The ``lr`` the guard adjusts is the base
learning rate, the value the schedule multiplies.

Why both levers: the clip range bounds how much each token's gradient may push the ratio (PPO,
Schulman et al. 2017), the learning rate bounds how far one optimizer step moves every token at
once; a runaway ratio with a small clip fraction (a few tokens, huge ratios) is the lr's doing.
"""

from __future__ import annotations

from typing import Any, Mapping

from armor_core import Verdict, hookimpl
from armor_core.hookspecs import RegisterStabilityGuard
from armor_core.stability.helpers import Knob, check_param, commit, finite_stat, format_changes

__all__ = ["ImportanceRatioGuard"]

NAME = "importance_ratio"


class ImportanceRatioGuard:
    """Tighten the clip range and/or lower the lr after ``patience`` runaway updates; relax when calm.

    :param max_clipfrac: ``pg_clipfrac + pg_clipfrac_lower`` above this is a runaway update.
    :param max_ratio: ``ratio_max`` above this is a runaway update (a token 10x more likely than
        when it was sampled).
    :param min_ratio: ``ratio_min`` below this is a runaway update.
    :param patience: runaway updates in a row before the guard acts.
    :param tighten_clip: adjust ``clip_ratio_low``/``clip_ratio_high``.
    :param lower_lr: adjust ``lr``.
    :param tighten_factor: multiply the clip ratios by this on each cut.
    :param lr_factor: multiply the lr by this on each cut.
    :param clip_ratio_floor: the clip ratios are never cut below this.
    :param min_lr_scale: the lr is never cut below ``min_lr_scale * lr``.
    :param recover_every: calm updates in a row per undone cut.
    :param clip_ratio_low: ``actor.clip_ratio_low`` of the run (the guard's starting point).
    :param clip_ratio_high: ``actor.clip_ratio_high`` of the run.
    :param lr: ``actor.lr`` of the run.
    """

    actions = {"update": ("adjust",)}

    def __init__(
        self,
        max_clipfrac: float = 0.1,
        max_ratio: float = 10.0,
        min_ratio: float = 0.1,
        patience: int = 3,
        tighten_clip: bool = True,
        lower_lr: bool = True,
        tighten_factor: float = 0.8,
        lr_factor: float = 0.5,
        clip_ratio_floor: float = 0.05,
        min_lr_scale: float = 0.1,
        recover_every: int = 10,
        clip_ratio_low: float = 0.2,
        clip_ratio_high: float = 0.2,
        lr: float = 3e-5,
    ) -> None:
        check_param(NAME, "max_clipfrac", max_clipfrac, ge=0)
        check_param(NAME, "max_ratio", max_ratio, gt=1)
        check_param(NAME, "min_ratio", min_ratio, ge=0, lt=1)
        check_param(NAME, "patience", patience, ge=1)
        check_param(NAME, "tighten_factor", tighten_factor, gt=0, lt=1)
        check_param(NAME, "lr_factor", lr_factor, gt=0, lt=1)
        check_param(NAME, "clip_ratio_floor", clip_ratio_floor, ge=0)
        check_param(NAME, "min_lr_scale", min_lr_scale, gt=0, le=1)
        check_param(NAME, "recover_every", recover_every, ge=1)
        check_param(NAME, "clip_ratio_low", clip_ratio_low, ge=0)
        check_param(NAME, "clip_ratio_high", clip_ratio_high, ge=0)
        check_param(NAME, "lr", lr, gt=0)
        if not (tighten_clip or lower_lr):
            raise ValueError(
                f"guard {NAME}: tighten_clip and lower_lr are both false, so the guard could never act; enable at "
                "least one"
            )
        self.max_clipfrac, self.max_ratio, self.min_ratio = float(max_clipfrac), float(max_ratio), float(min_ratio)
        self.patience, self.recover_every = int(patience), int(recover_every)
        self.tighten_clip, self.lower_lr = bool(tighten_clip), bool(lower_lr)
        self.tighten_factor, self.lr_factor = float(tighten_factor), float(lr_factor)
        self.knobs = {
            "clip_ratio_low": Knob("clip_ratio_low", clip_ratio_low, clip_ratio_floor, clip_ratio_low),
            "clip_ratio_high": Knob("clip_ratio_high", clip_ratio_high, clip_ratio_floor, clip_ratio_high),
            "lr": Knob("lr", lr, min_lr_scale * lr, lr),
        }
        self.hot = 0  # runaway updates in a row
        self.calm = 0  # calm updates in a row

    def _signals(self, stats: Mapping[str, float]) -> list[tuple[str, float, float]] | None:
        """``[(what, value, threshold)]`` beyond their thresholds; None when the update reported nothing."""
        upper = finite_stat(stats, "actor/pg_clipfrac")
        lower = finite_stat(stats, "actor/pg_clipfrac_lower")
        rmax = finite_stat(stats, "actor/ratio_max")
        rmin = finite_stat(stats, "actor/ratio_min")
        if upper is None and lower is None and rmax is None and rmin is None:
            return None  # skipped update, or non-finite stats (non_finite's business)
        out = []
        if upper is not None or lower is not None:
            frac = (upper or 0.0) + (lower or 0.0)
            if frac > self.max_clipfrac:
                out.append(("clip fraction", frac, self.max_clipfrac))
        if rmax is not None and rmax > self.max_ratio:
            out.append(("ratio_max", rmax, self.max_ratio))
        if rmin is not None and rmin < self.min_ratio:
            out.append(("ratio_min", rmin, self.min_ratio))
        return out

    def observe(self, stage: str, stats: Mapping[str, float], step: int) -> Verdict:
        if stage != "update":
            return Verdict.proceed()
        beyond = self._signals(stats)
        if beyond is None:
            return Verdict.proceed()
        k = self.knobs
        if beyond:
            self.hot, self.calm = self.hot + 1, 0
            if self.hot < self.patience:
                return Verdict.proceed()
            self.hot = 0
            proposals = {}
            if self.tighten_clip:
                proposals["clip_ratio_low"] = k["clip_ratio_low"].value * self.tighten_factor
                proposals["clip_ratio_high"] = k["clip_ratio_high"].value * self.tighten_factor
            if self.lower_lr:
                proposals["lr"] = k["lr"].value * self.lr_factor
            changed = commit(k, proposals)
            if not changed:
                return Verdict.proceed()  # everything is at its floor already
            what, value, threshold = beyond[0]
            detail = "; ".join(f"{w} {v:.4g} beyond {t:.4g}" for w, v, t in beyond)
            return Verdict(
                "adjust",
                f"{self.patience} runaway updates in a row ({detail}): {format_changes(changed)}",
                signal=value,
                threshold=threshold,
                adjustments=changed,
            )
        self.hot, self.calm = 0, self.calm + 1
        if self.calm < self.recover_every:
            return Verdict.proceed()
        self.calm = 0
        changed = commit(
            k,
            {
                "clip_ratio_low": k["clip_ratio_low"].value / self.tighten_factor,
                "clip_ratio_high": k["clip_ratio_high"].value / self.tighten_factor,
                "lr": k["lr"].value / self.lr_factor,
            },
        )
        if not changed:
            return Verdict.proceed()
        return Verdict(
            "adjust",
            f"{self.recover_every} calm updates in a row: relaxing towards the initial values: "
            f"{format_changes(changed)}",
            adjustments=changed,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"hot": self.hot, "calm": self.calm, **{name: knob.state_dict() for name, knob in self.knobs.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.hot = int(state.get("hot", 0))
        self.calm = int(state.get("calm", 0))
        for name, knob in self.knobs.items():
            knob.load_state_dict(state.get(name))


@hookimpl
def armor_register_stability_guards(register: RegisterStabilityGuard) -> None:
    register(NAME, ImportanceRatioGuard)
