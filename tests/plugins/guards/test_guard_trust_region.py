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
    # 0.12 > 2 x 0.03: undone; far out the cut is linear: lr * 0.015 / 0.12 = 5e-4 * 0.125 = 6.25e-5
    v = g.observe("step", {"policy_kl": 0.12, "lr": 5e-4}, 1)
    assert v.action == "skip" and v.adjustments["lr"] == pytest.approx(6.25e-5, rel=1e-9) and v.threshold == 0.06
    # but tenfold at most: 0.48 would have cut it 32 times
    v = TrustRegionGuard(target_kl=0.03, lr=5e-4).observe("step", {"policy_kl": 0.48, "lr": 5e-4}, 1)
    assert v.action == "skip" and v.adjustments["lr"] == pytest.approx(5e-5, rel=1e-9)
    # 0.05 is over the target, under the skip line: the step stands; 6.25e-5 * sqrt(0.015 / 0.05) = 3.4233e-5
    v = g.observe("step", {"policy_kl": 0.05, "lr": 6.25e-5}, 2)
    assert v.action == "adjust" and v.adjustments["lr"] == pytest.approx(3.4233e-5, rel=1e-4)
    lr = v.adjustments["lr"]
    # calm (under 0.25 x 0.03 = 0.0075), but the rate is given back for a calm batch, once it is done: not yet
    assert g.observe("step", {"policy_kl": 0.001, "lr": lr}, 3).action == "proceed"
    # step 3's batch was calm: back up by 1.2 toward the run's 5e-4, at the next batch's first step
    v = g.observe("step", {"policy_kl": 0.02, "lr": lr}, 4)
    assert v.action == "adjust" and v.adjustments["lr"] == pytest.approx(lr * 1.2, rel=1e-9) and v.signal == 0.001
    lr = v.adjustments["lr"]
    assert g.observe("step", {"policy_kl": 0.001, "lr": lr}, 5).action == "proceed"  # step 4's 0.02: in the band
    # a raised lr that overshoots after calm steps: too high for this run, so it becomes the ceiling
    v = g.observe("step", {"policy_kl": 0.04, "lr": lr}, 6)
    assert v.action == "adjust" and v.adjustments["lr"] == pytest.approx(lr * math.sqrt(0.015 / 0.04), rel=1e-9)
    lr = v.adjustments["lr"]
    assert g.observe("step", {"policy_kl": 0.001, "lr": lr}, 7).action == "proceed"
    assert g.observe("step", {"policy_kl": 0.001, "lr": lr}, 8).action == "proceed"  # not raised past the ceiling
    state = {
        "ceiling": lr, "quiet": 2, "last_lr": lr, "batch_step": 8, "batch_kl": 0.001, "batch_calm": True, "judged": 8,
        "base": 5e-4, "raised": False, "prev_lr": 5e-4, "good_val": None,  # the driver's part: no update shown
    }  # fmt: skip
    assert g.state_dict() == state
    resumed = TrustRegionGuard(target_kl=0.03, lr=5e-4)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state


def test_trust_region_holds_a_batchs_steps_together_to_the_batch_line():
    g = TrustRegionGuard(target_kl=0.05, lr=1e-3)  # lines: one step 2 x 0.05 = 0.1, a batch's steps 4 x 0.05 = 0.2
    assert g.observe("step", {"policy_kl": 0.001, "lr": 1e-3}, 1).action == "proceed"  # the run's first step, calm
    v = g.observe("step", {"policy_kl": 0.08, "lr": 1e-3}, 2)  # under the line: stands, lr * sqrt(0.025 / 0.08)
    assert v.action == "adjust" and v.adjustments["lr"] == pytest.approx(1e-3 * math.sqrt(0.025 / 0.08), rel=1e-9)
    lr = v.adjustments["lr"]
    v = g.observe("step", {"policy_kl": 0.09, "lr": lr}, 2)  # 0.17 with the first, under 0.2: stands, cut again
    assert v.action == "adjust" and v.adjustments["lr"] == pytest.approx(lr * math.sqrt(0.025 / 0.09), rel=1e-9)
    lr = v.adjustments["lr"]
    v = g.observe("step", {"policy_kl": 0.05, "lr": lr}, 2)  # 0.22 with the two before: undone, lr * 0.025 / 0.05
    assert v.action == "skip" and v.signal == pytest.approx(0.22) and v.threshold == pytest.approx(0.2)
    assert v.adjustments["lr"] == pytest.approx(lr * 0.5, rel=1e-9) and "0.22 with this batch" in v.reason
    lr = v.adjustments["lr"]
    assert g.observe("step", {"policy_kl": 0.021, "lr": lr}, 2).action == "proceed"  # 0.191: still in the budget
    assert g.observe("step", {"policy_kl": 0.02, "lr": lr}, 2).action == "skip"  # small, but past the budget
    assert g.observe("step", {"policy_kl": 0.021, "lr": lr}, 3).action == "proceed"  # a new batch, a new budget
    assert g.state_dict()["batch_step"] == 3 and g.state_dict()["batch_kl"] == pytest.approx(0.021)
    # several small steps on one batch add up to the line as well (8 optimizer steps per batch)
    g = TrustRegionGuard(target_kl=0.05, lr=1e-3)
    actions = [g.observe("step", {"policy_kl": 0.03, "lr": 1e-3}, 1).action for _ in range(8)]
    assert actions == ["proceed"] * 6 + ["skip"] * 2


def test_trust_region_lets_adams_first_step_stand_in_the_band_but_not_past_the_undo_line():
    # AdamW's first step moves every weight by the full rate: over the target but under the undo line, it stands
    g = TrustRegionGuard(target_kl=0.05, lr=1e-4)
    assert g.observe("step", {"policy_kl": 0.07, "lr": 1e-4}, 1).action == "proceed"
    # the same KL on the batch's next step (no longer Adam's first) lowers the rate: 1e-4 * sqrt(0.025 / 0.07)
    v = g.observe("step", {"policy_kl": 0.07, "lr": 1e-4}, 1)
    assert v.action == "adjust" and v.adjustments["lr"] == pytest.approx(1e-4 * math.sqrt(0.025 / 0.07), rel=1e-9)
    # past the undo line (2 x 0.05) the first step is undone like any other
    assert (
        TrustRegionGuard(target_kl=0.05, lr=1e-3).observe("step", {"policy_kl": 0.46, "lr": 1e-3}, 1).action == "skip"
    )
    # a resumed run's step 1 (its guard state says it has judged steps) is no first step; nor is a first step judged
    # later than step 1 (watch_steps=0 measures one step in `every`: the optimizer has stepped before)
    resumed = TrustRegionGuard(target_kl=0.05, lr=1e-4)
    resumed.load_state_dict({"judged": 3})
    assert resumed.observe("step", {"policy_kl": 0.07, "lr": 1e-4}, 1).action == "adjust"
    assert (
        TrustRegionGuard(target_kl=0.05, lr=1e-4).observe("step", {"policy_kl": 0.07, "lr": 1e-4}, 4).action == "adjust"
    )


def test_trust_region_lets_a_distillation_step_cover_a_quarter_of_the_kl_to_the_teacher():
    # recipe:distill's first step moved the policy 0.46 nats/token, with the teacher 3.2 away: a step toward it
    g = TrustRegionGuard(target_kl=0.05, lr=5e-4)
    assert g.observe("step", {"policy_kl": 0.46, "lr": 5e-4, "teacher_kl": 3.2}, 1).action == "proceed"
    assert TrustRegionGuard(target_kl=0.05, lr=5e-4).observe("step", {"policy_kl": 0.46, "lr": 5e-4}, 1).action == (
        "skip"  # the same step without a teacher: a runaway
    )
    # the teacher 0.4 away: the target is 0.1, the skip line 0.2; 0.15 stands and lowers the lr to aim at 0.05
    v = g.observe("step", {"policy_kl": 0.15, "lr": 5e-4, "teacher_kl": 0.4}, 2)
    assert v.action == "adjust" and v.adjustments["lr"] == pytest.approx(5e-4 * math.sqrt(0.05 / 0.15), rel=1e-9)
    # close to the teacher, its own target_kl again: 0.11 is past 2 x 0.05
    v = g.observe("step", {"policy_kl": 0.11, "lr": v.adjustments["lr"], "teacher_kl": 0.1}, 3)
    assert v.action == "skip" and v.threshold == pytest.approx(0.1)


def test_trust_region_gives_a_rate_back_for_a_batch_calm_as_a_whole():
    # the code recipe trains each batch in 4 optimizer steps: each of them calm alone, together not
    g = TrustRegionGuard(target_kl=0.05, lr=1e-3)
    lr = g.observe("step", {"policy_kl": 0.2, "lr": 1e-3}, 1).adjustments["lr"]  # undone, cut to 1.25e-4
    for step in (2, 3):
        actions = [g.observe("step", {"policy_kl": 0.006, "lr": lr}, step).action for _ in range(4)]
        assert actions == ["proceed"] * 4  # batches of 0.024 nats/token, over 0.0125: the rate stays
    v = g.observe("step", {"policy_kl": 0.002, "lr": lr}, 4)  # step 3's batch was not calm either
    assert v.action == "proceed"
    for _ in range(3):
        g.observe("step", {"policy_kl": 0.002, "lr": lr}, 4)
    v = g.observe("step", {"policy_kl": 0.002, "lr": lr}, 5)  # step 4's batch: 0.008, calm: given back once
    assert v.action == "adjust" and v.adjustments["lr"] == pytest.approx(lr * 1.2) and v.signal == pytest.approx(0.008)
    assert g.observe("step", {"policy_kl": 0.002, "lr": lr * 1.2}, 5).action == "proceed"  # once per batch


def test_trust_region_gives_back_the_whole_lr_after_a_burst_of_overshoots():
    g = TrustRegionGuard(target_kl=0.03, lr=5e-5)
    lr = 5e-5
    for step in (1, 2, 3):  # steps in a row far out (a learning-rate spike): each undone, the lr cut tenfold at most
        v = g.observe("step", {"policy_kl": 1.0, "lr": lr}, step)
        assert v.action == "skip" and v.adjustments["lr"] == pytest.approx(lr * 0.1, rel=1e-9)
        lr = v.adjustments["lr"]
    v = g.observe("step", {"policy_kl": 1.0, "lr": lr}, 4)  # at the floor (1e-3 x the run's): undone, not cut
    assert v.action == "skip" and v.adjustments.get("lr", lr) == pytest.approx(lr) == pytest.approx(5e-8, rel=1e-9)
    assert g.observe("step", {"policy_kl": 1e-4, "lr": lr}, 5).action == "proceed"  # after the burst's last batch
    raised = 0
    for step in range(6, 70):
        v = g.observe("step", {"policy_kl": 1e-4, "lr": lr}, step)
        if v.action == "proceed":
            break
        lr, raised = v.adjustments["lr"], raised + 1
    # back to back overshoots say nothing about the lr: every calm batch raises it 1.2x, up to exactly the run's
    assert lr == 5e-5 and raised == math.ceil(math.log(1e3) / math.log(1.2))


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
    g.observe("step", {"policy_kl": 0.001, "lr": 8.5e-5}, 14)  # a calm batch: its rate is raised at the next one
    g.observe("step", {"policy_kl": 0.001, "lr": 8.5e-5}, 15)  # raised to 1.02e-4, capped at the run's 1e-4
    assert [g.needs_at(s) for s in (17, 20)] == [False, True]


def test_trust_region_boundaries_and_floor():
    g = TrustRegionGuard(target_kl=0.03, lr=1e-4, min_lr_scale=0.5)
    assert g.observe("step", {"policy_kl": 0.03, "lr": 1e-4}, 1).action == "proceed"  # at the target: fine
    assert g.observe("step", {"policy_kl": 0.0075, "lr": 1e-4}, 2).action == "proceed"  # calm at the run's lr
    v = g.observe("step", {"policy_kl": 0.05, "lr": 5e-5}, 3)  # already at the floor (0.5 x 1e-4): nothing to do
    assert v.action == "proceed"
    v = g.observe("step", {"policy_kl": 0.07, "lr": 5e-5}, 4)  # past 2 x 0.03 at the floor: undone, lr unchanged
    assert v.action == "skip" and v.adjustments == {}
    assert g.observe("update", {"policy_kl": 9.0, "lr": 1e-4}, 5).action == "proceed"  # stage step only
    assert g.observe("step", {"lr": 1e-4}, 6).action == "proceed"  # no measurement, no verdict
    assert TrustRegionGuard.needs == ("policy_kl",) and TrustRegionGuard.stages == ("step", "update", "validation")


def test_trust_region_rolls_back_a_validation_that_fell_while_the_rate_ran_raised_and_holds_it_at_the_cut():
    # the driver's instance: the rate of each update (stage update) and the validations
    g = TrustRegionGuard(target_kl=0.05, lr=1e-3)
    assert g.observe("validation", {"val/acc_greedy": 0.68}, 0).action == "proceed"  # the first: nothing to compare
    for step, lr in enumerate([1e-3, 1e-4, 1e-4], start=1):  # the first step undone and its rate cut tenfold
        assert g.observe("update", {"actor/lr": lr}, step).action == "proceed"
    # a drop by more than max(0.1, 0.25 x 0.68 = 0.17) with the rate only at the cut: no raise to blame
    assert g.observe("validation", {"val/acc_greedy": 0.3}, 3).action == "proceed"
    for step, lr in [(4, 1.2e-4), (5, 1.44e-4)]:  # calm batches give the rate back
        g.observe("update", {"actor/lr": lr}, step)
    # measured against the last good one, 0.3: the line 0.3 - max(0.1, 0.075) = 0.2; 0.25 is a dip, no more
    assert g.observe("validation", {"val/acc_greedy": 0.25}, 5).action == "proceed"
    g.observe("update", {"actor/lr": 1.44e-4}, 6)  # still above the cut: the raise goes on being suspected
    g.observe("update", {"actor/lr": 1.3e-4}, 7)  # cut again, but still above the lowest rate the run ran at
    v = g.observe("validation", {"val/acc_greedy": 0.1}, 10)  # the line 0.25 - 0.1 = 0.15
    assert (v.action, v.since, v.adjustments) == ("rollback", 6, {"lr": pytest.approx(1e-4)})
    assert v.threshold == pytest.approx(0.15) and v.signal == 0.1
    # back at the cut, nothing raised: a later drop is not the rate's
    g.observe("update", {"actor/lr": 1e-4}, 11)
    assert g.observe("validation", {"val/acc_greedy": 0.0}, 20).action == "proceed"
    resumed = TrustRegionGuard(target_kl=0.05, lr=1e-3)
    resumed.load_state_dict(g.state_dict())
    assert resumed.state_dict() == g.state_dict()
    # a run never cut is never rolled back for its validation, however far it dips
    g3 = TrustRegionGuard(target_kl=0.05, lr=1e-3)
    g3.observe("validation", {"val/acc_greedy": 0.9}, 0)
    g3.observe("update", {"actor/lr": 1e-3}, 1)
    assert g3.observe("validation", {"val/acc_greedy": 0.1}, 10).action == "proceed"


def test_trust_region_in_a_worker_takes_a_rate_the_driver_set_as_its_ceiling():
    g = TrustRegionGuard(target_kl=0.05, lr=1e-3)
    v = g.observe("step", {"policy_kl": 0.6, "lr": 1e-3}, 1)  # undone, cut tenfold
    assert v.adjustments["lr"] == pytest.approx(1e-4)
    lr = 1e-4
    for step in range(2, 5):  # calm batches raise it by 1.2 each, from step 3 on
        lr = g.observe("step", {"policy_kl": 0.001, "lr": lr}, step).adjustments.get("lr", lr)
    assert lr == pytest.approx(1.44e-4)
    g.adjusted({"lr": 1e-4})  # the driver's rollback for a validation set the rate back to the cut
    assert g.state_dict()["ceiling"] == pytest.approx(1e-4)
    assert g.observe("step", {"policy_kl": 0.001, "lr": 1e-4}, 5).action == "proceed"
    assert g.observe("step", {"policy_kl": 0.001, "lr": 1e-4}, 6).action == "proceed"  # calm, but raised no more
    g.adjusted({"clip_ratio_high": 0.2})  # not the rate: nothing changes
    assert g.state_dict()["ceiling"] == pytest.approx(1e-4)
