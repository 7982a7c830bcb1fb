"""The ``trust_region`` guard: each optimizer step's ``policy_kl`` bounded, the lr set from how far it moved.

Hand-computed sequences showing exactly when the guard acts and what it returns; the expected values are
worked out in the comment next to them.
"""

from __future__ import annotations

import math

import pytest

from armor_plugins.guards.trust_region import TrustRegionGuard


def test_trust_region_undoes_a_far_step_and_sets_the_lr_from_how_far_it_moved():
    g = TrustRegionGuard(target_kl=0.03, lr=5e-4)
    # 0.48 > 4 x 0.03: undone; lr * sqrt(0.015 / 0.48) = 5e-4 * 0.176777 = 8.8388e-5
    v = g.observe("step", {"policy_kl": 0.48, "lr": 5e-4}, 1)
    assert v.action == "skip" and v.adjustments["lr"] == pytest.approx(8.8388e-5, rel=1e-4) and v.threshold == 0.12
    # 0.06 is over the target, under the skip line: the step stands; 8.8388e-5 * sqrt(0.015 / 0.06) = 4.4194e-5
    v = g.observe("step", {"policy_kl": 0.06, "lr": 8.8388e-5}, 2)
    assert v.action == "adjust" and v.adjustments["lr"] == pytest.approx(4.4194e-5, rel=1e-4)
    # calm (under 0.25 x 0.03 = 0.0075): back up by 1.2 toward the run's 5e-4
    v = g.observe("step", {"policy_kl": 0.001, "lr": 4.4194e-5}, 3)
    assert v.action == "adjust" and v.adjustments["lr"] == pytest.approx(5.3033e-5, rel=1e-4)
    assert g.observe("step", {"policy_kl": 0.02, "lr": 5.3033e-5}, 4).action == "proceed"  # inside the band
    # a raised lr that overshoots after calm steps: too high for this run, so it becomes the ceiling
    v = g.observe("step", {"policy_kl": 0.04, "lr": 5.3033e-5}, 5)  # 5.3033e-5 * sqrt(0.015 / 0.04) = 3.2476e-5
    assert v.action == "adjust" and v.adjustments["lr"] == pytest.approx(3.2476e-5, rel=1e-4)
    assert g.observe("step", {"policy_kl": 0.001, "lr": 3.2476e-5}, 6).action == "proceed"  # not raised past it
    assert g.state_dict() == {
        "ceiling": pytest.approx(3.2476e-5, rel=1e-4),
        "quiet": 1,
        "last_lr": pytest.approx(3.2476e-5, rel=1e-4),
    }


def test_trust_region_gives_back_the_whole_lr_after_a_burst_of_overshoots():
    g = TrustRegionGuard(target_kl=0.03, lr=5e-5)
    lr = 5e-5
    for step in (1, 2, 3):  # three steps in a row far out (a learning-rate spike): each undone, the lr cut each time
        v = g.observe("step", {"policy_kl": 1.0, "lr": lr}, step)
        assert v.action == "skip" and v.adjustments["lr"] == pytest.approx(lr * math.sqrt(0.015), rel=1e-9)
        lr = v.adjustments["lr"]
    raised = 0
    for step in range(4, 60):
        v = g.observe("step", {"policy_kl": 1e-4, "lr": lr}, step)
        if v.action == "proceed":
            break
        lr, raised = v.adjustments["lr"], raised + 1
    # back to back overshoots say nothing about the lr: every calm step raises it 1.2x, up to exactly the run's
    assert lr == 5e-5 and raised == math.ceil(math.log(1 / 0.015**1.5) / math.log(1.2))


def test_trust_region_measures_every_step_while_it_matters_and_one_in_every_otherwise():
    g = TrustRegionGuard(target_kl=0.03, lr=1e-4, every=4, watch_steps=3)
    assert [g.needs_at(s) for s in (1, 2, 3)] == [True] * 3  # the first steps
    for s in (1, 2, 3):
        g.observe("step", {"policy_kl": 0.01, "lr": 1e-4}, s)
    assert [g.needs_at(s) for s in (4, 5, 6, 7, 8)] == [True, False, False, False, True]  # calm: one in 4
    g.observe("step", {"policy_kl": 0.05, "lr": 1e-4}, 8)  # an overshoot: the lr is lowered
    assert all(g.needs_at(s) for s in (9, 10, 11))
    for s in (9, 10, 11, 12, 13):
        g.observe("step", {"policy_kl": 0.01, "lr": 7e-5}, s)  # quiet again, but not calm enough to raise the lr
    assert g.needs_at(14)  # the lr is still lowered: every step
    g.observe("step", {"policy_kl": 0.001, "lr": 8.5e-5}, 14)  # calm: raised to 1.02e-4, capped at the run's 1e-4
    assert [g.needs_at(s) for s in (15, 16)] == [False, True]


def test_trust_region_boundaries_and_floor():
    g = TrustRegionGuard(target_kl=0.03, lr=1e-4, min_lr_scale=0.5)
    assert g.observe("step", {"policy_kl": 0.03, "lr": 1e-4}, 1).action == "proceed"  # at the target: fine
    assert g.observe("step", {"policy_kl": 0.0075, "lr": 1e-4}, 2).action == "proceed"  # calm at the run's lr
    v = g.observe("step", {"policy_kl": 0.1, "lr": 5e-5}, 3)  # already at the floor (0.5 x 1e-4): nothing to do
    assert v.action == "proceed"
    v = g.observe("step", {"policy_kl": 0.2, "lr": 5e-5}, 4)  # far out at the floor: undone, lr unchanged
    assert v.action == "skip" and v.adjustments == {}
    assert g.observe("update", {"policy_kl": 9.0, "lr": 1e-4}, 5).action == "proceed"  # stage step only
    assert g.observe("step", {"lr": 1e-4}, 6).action == "proceed"  # no measurement, no verdict
    assert TrustRegionGuard.needs == ("policy_kl",) and TrustRegionGuard.stages == ("step",)
