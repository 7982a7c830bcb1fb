"""The ``update_size`` guard (stage ``step``, opt-in): a far too large step undone, the lr lowered.

Hand-computed sequences showing exactly when the guard acts and what it returns; the expected values are
worked out in the comment next to them (the running-moment formulas are in ``armor_core/stability/helpers.py``).
"""

from __future__ import annotations

import json

import pytest

from armor_core.stability.guard import GuardRunner
from armor_plugins.guards.update_size import UpdateSizeGuard


def test_update_size_skips_a_spike_against_the_recent_median(run, actions):
    g = UpdateSizeGuard(spike_factor=8.0, warmup=3, window=4)
    ratios = [1e-3, 2e-3, 1.5e-3, 1.1e-2, 1.3e-2, 1e-3, 3e-3]
    v = run(g, "step", ratios, "update_ratio", lr=1e-4)
    # after 3 accepted: median 1.5e-3, limit 1.2e-2 -> 1.1e-2 passes (history [1e-3, 2e-3, 1.5e-3, 1.1e-2]),
    # median then 1.75e-3, limit 1.4e-2 -> 1.3e-2 passes; window 4 keeps [2e-3, 1.5e-3, 1.1e-2, 1.3e-2]
    assert actions(v) == ["proceed"] * 7
    g = UpdateSizeGuard(spike_factor=8.0, warmup=3, window=4)
    v = run(g, "step", [1e-3, 2e-3, 1.5e-3, 1.3e-2, 1.2e-2, 1e-3], "update_ratio", lr=1e-4)
    # 1.3e-2 > 8 * 1.5e-3 = 1.2e-2: undone and kept out; 1.2e-2 is not > 1.2e-2
    assert actions(v) == ["proceed", "proceed", "proceed", "skip", "proceed", "proceed"]
    assert v[3].threshold == pytest.approx(1.2e-2) and v[3].adjustments == {}
    assert g.recent == [2e-3, 1.5e-3, 1.2e-2, 1e-3]  # the last 4 accepted; the spike is not among them


def test_update_size_ceiling_lowers_lr_and_undoes_far_too_large_steps():
    g = UpdateSizeGuard(max_ratio=2e-3, skip_factor=4.0, lr_factor=0.5, warmup=5)
    v = g.observe("step", {"update_ratio": 1.2e-2, "lr": 5e-4}, 1)
    # 1.2e-2 > 4 * 2e-3: undone; lr * min(0.5, 2e-3 / 1.2e-2 = 1/6) = 8.333e-5
    assert v.action == "skip" and v.adjustments["lr"] == pytest.approx(5e-4 / 6) and v.threshold == pytest.approx(8e-3)
    assert g.recent == []
    v = g.observe("step", {"update_ratio": 3e-3, "lr": 8e-5}, 2)
    # above the ceiling, below 4x: applied, lr * min(0.5, 2/3) = 4e-5
    assert v.action == "adjust" and v.adjustments["lr"] == pytest.approx(4e-5) and g.recent == [3e-3]
    assert g.observe("step", {"update_ratio": 1.9e-3, "lr": 4e-5}, 3).action == "proceed"
    g = UpdateSizeGuard(max_ratio=2e-3, min_lr=1e-4)  # the floor: never lowered below min_lr
    assert g.observe("step", {"update_ratio": 3e-3, "lr": 1.5e-4}, 1).adjustments == {"lr": 1e-4}
    assert g.observe("step", {"update_ratio": 3e-3, "lr": 1e-4}, 2).adjustments == {}
    # other stages and non-finite ratios are not this guard's business
    assert g.observe("grad", {"update_ratio": 1.0}, 3).action == "proceed"
    assert g.observe("step", {"update_ratio": float("nan"), "lr": 1e-4}, 3).action == "proceed"


def test_update_size_is_an_opt_in_stage(tmp_path):
    """The worker copies the parameters for stage ``step`` only when some guard asks for it."""
    from armor_core.plugins import get_plugin_manager

    pm = get_plugin_manager()
    assert not GuardRunner([{"name": "non_finite"}, {"name": "grad_spike"}], pm=pm).watches("step")
    runner = GuardRunner(
        [{"name": "non_finite"}, {"name": "update_size", "params": {"warmup": 1}}], pm=pm, run_dir=tmp_path
    )
    assert runner.watches("step") and runner.watches("grad")
    runner.observe("step", {"update_ratio": 1e-3, "lr": 1e-4}, 1)
    assert runner.observe("step", {"update_ratio": 1.0, "lr": 1e-4}, 2).action == "skip"
    events = [json.loads(x) for x in (tmp_path / "guard_events.jsonl").read_text().splitlines()]
    assert [(e["step"], e["stage"], e["guard"], e["action"]) for e in events] == [(2, "step", "update_size", "skip")]
