"""``armor_core.stability.helpers``: the guard authors' helpers, public so that a third-party guard writes its
statistics, state and adjustments the way the built-in guards do (issue 43)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, ClassVar, Mapping

import pytest

from armor_core import Verdict, hookimpl
from armor_core.hookspecs import RegisterStabilityGuard
from armor_core.stability.helpers import Knob, RunningMoments, check_param, commit, finite_stat, format_changes
from armor_core.testing import check_guard, registered


class LossDriftGuard:
    """What a third party would write: lower ``lr`` when ``pg_loss`` leaves its running band, using only the
    public helpers (no ``armor_plugins`` import)."""

    stages = ("update",)
    actions: ClassVar[dict[str, tuple[str, ...]]] = {"update": ("adjust",)}

    def __init__(self, lr: float = 1e-6, z: float = 3.0, window: int = 10) -> None:
        check_param("loss_drift", "z", z, gt=0)
        self.z = float(z)
        self.moments = RunningMoments(window)
        self.knobs = {"lr": Knob("lr", lr, lo=lr / 10, hi=lr)}

    def observe(self, stage: str, stats: Mapping[str, float], step: int) -> Verdict:
        loss = finite_stat(stats, "pg_loss")
        if loss is None:
            return Verdict.proceed()
        far = self.moments.n >= 3 and abs(loss - self.moments.mean) > self.z * self.moments.std + 1e-12
        self.moments.update(loss)
        if not far:
            return Verdict.proceed()
        changed = commit(self.knobs, {"lr": self.knobs["lr"].value / 2})
        if not changed:
            return Verdict.proceed()
        return Verdict("adjust", f"pg_loss {loss:.3g} off its band: {format_changes(changed)}", adjustments=changed)

    def state_dict(self) -> dict[str, Any]:
        return {"moments": self.moments.state_dict(), "lr": self.knobs["lr"].state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.moments.load_state_dict(state.get("moments", {}))
        self.knobs["lr"].load_state_dict(state.get("lr"))


class LossDriftPlugin:
    @hookimpl
    def armor_register_stability_guards(self, register: RegisterStabilityGuard) -> None:
        register("loss_drift", LossDriftGuard)


def test_a_third_party_guard_built_on_the_public_helpers_meets_the_contract():
    with registered(LossDriftPlugin(), load_entrypoints=False) as pm:
        guard_cls = pm.get("stability_guard", "loss_drift")
    verdicts = check_guard(guard_cls, stats={"update": {"pg_loss": 1.0}}, steps=5)  # NaN, inf, missing, resume
    assert all(v.action in ("proceed", "adjust") for _, _, v in verdicts)
    # a loss steady near 1.0 for 12 steps, then 5.0 (NaN in between is no observation): lr halves at step 13
    guard = guard_cls(lr=1e-5)
    losses = [1.0, 1.01, 0.99, 1.0] * 3 + [float("nan"), 5.0]
    adjusted = [
        (step, v.adjustments)
        for step, loss in enumerate(losses)
        if (v := guard.observe("update", {"pg_loss": loss}, step)).action == "adjust"
    ]
    assert adjusted == [(13, {"lr": 5e-6})]
    # the knob stops at its floor, lr / 10, and a commit that moves nothing reports nothing
    knob = guard.knobs["lr"]
    assert commit({"lr": knob}, {"lr": 0.0}) == {"lr": pytest.approx(1e-6)} and commit({"lr": knob}, {"lr": 0.0}) == {}


def test_a_bad_parameter_is_named_with_its_range():
    with pytest.raises(ValueError, match=r"guard loss_drift: parameter z=-1 must be > 0"):
        LossDriftGuard(z=-1)


def test_the_helpers_are_light_to_import():
    """The module imports nothing of ARMOR's machinery, nor torch, nor the built-in plugins: it runs in the driver
    and on every actor rank, and a guard package may import it at entry-point load time."""
    code = (
        "import sys, armor_core.stability.helpers\n"
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('armor_plugins', 'armor_core.stability.guard'))]\n"
        "assert bad == [], bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
