"""``kl``: keep the policy near the reference model; roll back when it has left it far behind.

At stage ``update`` the guard reads the KL to the reference policy: ``actor/kl_loss`` (the KL term
of the loss, GRPO style) when the update reports it, else ``actor/reward_kl`` (the in-reward
penalty, PPO style). Three regimes, relative to ``target``:

* ``kl > rollback_factor * target``: ``rollback``. A policy this far from the reference has
  usually collapsed onto degenerate text (reward hacking, repetition); a smaller step from here
  does not bring it back, the last good checkpoint does.
* ``kl > target`` for ``patience`` updates in a row: ``adjust``. With the KL loss, raise
  ``kl_loss_coef`` (times ``coef_factor``, up to ``max_kl_loss_coef``); once it is at its maximum
  (or is 0, which no factor raises), or when the KL is the in-reward one (whose coefficient
  belongs to ``algorithm.kl_ctrl_type``), lower the base ``lr`` (times ``lr_factor``, not below
  ``min_lr_scale * lr``; the base is the value the schedule multiplies). The streak then restarts.
* ``kl < recover_below * target`` for ``recover_every`` updates in a row: undo one raise of the
  coefficient and one cut of the lr (never past the initial values). The gap between
  ``recover_below * target`` and ``target`` is hysteresis: a KL hovering at the target would
  otherwise have the coefficient raised and lowered on alternate steps.

The multiplicative raise is the discrete form of the adaptive KL controller of Ziegler et al.
(2019, "Fine-Tuning Language Models from Human Preferences", sec. 2.2), acting only outside the band.

Long function: ``KLGuard.observe``, the three regimes above in one place, in the order they are stated.
"""

from __future__ import annotations

from typing import Any, Mapping

from armor_core import Verdict, hookimpl
from armor_core.hookspecs import RegisterStabilityGuard
from armor_core.stability.helpers import Knob, check_param, commit, finite_stat, format_changes

__all__ = ["KLGuard"]

NAME = "kl"
KL_KEYS = ("actor/kl_loss", "actor/reward_kl")


class KLGuard:
    """Raise the KL coefficient or lower the lr when the KL to the reference passes ``target``.

    :param target: per-token KL (nats) above which the guard steps in.
    :param rollback_factor: ``kl > rollback_factor * target`` asks for a rollback.
    :param patience: updates in a row above ``target`` before an adjustment.
    :param coef_factor: multiply ``kl_loss_coef`` by this on each raise.
    :param max_kl_loss_coef: ``kl_loss_coef`` is never raised beyond this.
    :param lr_factor: multiply the lr by this on each cut.
    :param min_lr_scale: the lr is never cut below ``min_lr_scale * lr``.
    :param recover_below: a KL below ``recover_below * target`` counts as calm.
    :param recover_every: calm updates in a row per undone step.
    :param kl_loss_coef: ``actor.kl_loss_coef`` of the run (the guard's starting point).
    :param lr: ``actor.lr`` of the run.
    """

    actions = {"update": ("adjust", "rollback")}

    def __init__(
        self,
        target: float = 0.1,
        rollback_factor: float = 10.0,
        patience: int = 2,
        coef_factor: float = 2.0,
        max_kl_loss_coef: float = 1.0,
        lr_factor: float = 0.5,
        min_lr_scale: float = 0.1,
        recover_below: float = 0.5,
        recover_every: int = 20,
        kl_loss_coef: float = 0.001,
        lr: float = 3e-5,
    ) -> None:
        check_param(NAME, "target", target, gt=0)
        check_param(NAME, "rollback_factor", rollback_factor, gt=1)
        check_param(NAME, "patience", patience, ge=1)
        check_param(NAME, "coef_factor", coef_factor, gt=1)
        check_param(NAME, "max_kl_loss_coef", max_kl_loss_coef, ge=0)
        check_param(NAME, "lr_factor", lr_factor, gt=0, lt=1)
        check_param(NAME, "min_lr_scale", min_lr_scale, gt=0, le=1)
        check_param(NAME, "recover_below", recover_below, ge=0, le=1)
        check_param(NAME, "recover_every", recover_every, ge=1)
        check_param(NAME, "kl_loss_coef", kl_loss_coef, ge=0)
        check_param(NAME, "lr", lr, gt=0)
        self.target, self.rollback_factor, self.recover_below = (
            float(target),
            float(rollback_factor),
            float(recover_below),
        )
        self.patience, self.recover_every = int(patience), int(recover_every)
        self.coef_factor, self.lr_factor = float(coef_factor), float(lr_factor)
        self.knobs = {
            "kl_loss_coef": Knob("kl_loss_coef", kl_loss_coef, kl_loss_coef, max_kl_loss_coef),
            "lr": Knob("lr", lr, min_lr_scale * lr, lr),
        }
        self.hot = 0
        self.calm = 0
        self.rollbacks = 0

    def observe(self, stage: str, stats: Mapping[str, float], step: int) -> Verdict:
        if stage != "update":
            return Verdict.proceed()
        key = next((k for k in KL_KEYS if k in stats), None)
        kl = finite_stat(stats, key) if key else None
        if kl is None:
            return Verdict.proceed()
        k = self.knobs
        if kl > self.rollback_factor * self.target:
            self.hot = self.calm = 0
            self.rollbacks += 1
            limit = self.rollback_factor * self.target
            return Verdict(
                "rollback",
                f"{key} {kl:.4g} is more than {self.rollback_factor:g}x the target {self.target:g}",
                signal=kl,
                threshold=limit,
            )
        if kl > self.target:
            self.hot, self.calm = self.hot + 1, 0
            if self.hot < self.patience:
                return Verdict.proceed()
            self.hot = 0
            coef = k["kl_loss_coef"]
            # the KL loss coefficient only acts on actor/kl_loss (the in-reward KL has its own
            # controller), and a coefficient of 0 cannot be raised by a factor
            if key == "actor/kl_loss" and 0 < coef.value < coef.hi:
                changed = commit(k, {"kl_loss_coef": coef.value * self.coef_factor})
            else:
                changed = commit(k, {"lr": k["lr"].value * self.lr_factor})
            if not changed:
                return Verdict.proceed()  # coefficient at its maximum and lr at its floor
            return Verdict(
                "adjust",
                f"{key} {kl:.4g} above the target {self.target:g} for {self.patience} updates: "
                f"{format_changes(changed)}",
                signal=kl,
                threshold=self.target,
                adjustments=changed,
            )
        self.hot = 0
        if kl >= self.recover_below * self.target:
            self.calm = 0
            return Verdict.proceed()
        self.calm += 1
        if self.calm < self.recover_every:
            return Verdict.proceed()
        self.calm = 0
        changed = commit(
            k, {"kl_loss_coef": k["kl_loss_coef"].value / self.coef_factor, "lr": k["lr"].value / self.lr_factor}
        )
        if not changed:
            return Verdict.proceed()
        return Verdict(
            "adjust",
            f"{key} below {self.recover_below:g}x the target for {self.recover_every} updates: relaxing: "
            f"{format_changes(changed)}",
            signal=kl,
            threshold=self.recover_below * self.target,
            adjustments=changed,
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "hot": self.hot,
            "calm": self.calm,
            "rollbacks": self.rollbacks,
            **{n: knob.state_dict() for n, knob in self.knobs.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.hot = int(state.get("hot", 0))
        self.calm = int(state.get("calm", 0))
        self.rollbacks = int(state.get("rollbacks", 0))
        for name, knob in self.knobs.items():
            knob.load_state_dict(state.get(name))


@hookimpl
def armor_register_stability_guards(register: RegisterStabilityGuard) -> None:
    register(NAME, KLGuard)
