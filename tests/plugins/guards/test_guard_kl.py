"""The ``kl`` guard: the KL coefficient raised, then the lr lowered, then a rollback; hysteresis and recovery.

Hand-computed sequences showing exactly when the guard acts and what it returns; the expected values are
worked out in the comment next to them.
"""

from __future__ import annotations

import pytest

from armor_plugins.guards.kl import KLGuard


def kl_guard(**kw):
    params = dict(
        target=0.1,
        rollback_factor=10.0,
        patience=2,
        coef_factor=2.0,
        max_kl_loss_coef=0.004,
        lr_factor=0.5,
        min_lr_scale=0.5,
        recover_below=0.5,
        recover_every=2,
        kl_loss_coef=0.001,
        lr=1e-4,
    )
    params.update(kw)
    return KLGuard(**params)


def test_kl_raises_the_coefficient_then_lowers_lr_then_rolls_back(run, actions):
    g = kl_guard()
    v = run(g, "update", [0.15, 0.12], "actor/kl_loss")
    assert actions(v) == ["proceed", "adjust"]
    assert v[1].adjustments == pytest.approx({"kl_loss_coef": 0.002}) and (v[1].signal, v[1].threshold) == (0.12, 0.1)
    v = run(g, "update", [0.2] * 6, "actor/kl_loss")
    assert [x.adjustments for x in v] == [
        {},
        pytest.approx({"kl_loss_coef": 0.004}),
        {},
        pytest.approx({"lr": 5e-5}),
        {},
        {},
    ]
    assert actions(v)[5] == "proceed"  # coefficient at its max (0.004) and lr at its floor (0.5 * 1e-4)
    v = g.observe("update", {"actor/kl_loss": 1.5}, 9)  # 1.5 > 10 * 0.1
    assert (v.action, v.signal, v.threshold) == ("rollback", 1.5, pytest.approx(1.0))


def test_kl_boundary_hysteresis_and_recovery(run, actions):
    g = kl_guard()
    run(g, "update", [0.2] * 6, "actor/kl_loss")  # coef 0.004, lr 5e-5
    # exactly at the target is not above it; between 0.05 and 0.1 is neither hot nor calm
    assert actions(run(g, "update", [0.1, 0.07, 0.1, 0.07], "actor/kl_loss")) == ["proceed"] * 4
    v = run(g, "update", [0.01] * 6, "actor/kl_loss")
    assert actions(v) == ["proceed", "adjust"] * 2 + ["proceed"] * 2
    assert v[1].adjustments == pytest.approx({"kl_loss_coef": 0.002, "lr": 1e-4})
    assert v[3].adjustments == pytest.approx({"kl_loss_coef": 0.001})  # lr back at its initial value already
    assert v[1].threshold == pytest.approx(0.05)


def test_kl_streak_is_broken_by_a_value_at_or_below_target(run, actions):
    g = kl_guard()
    assert actions(run(g, "update", [0.2, 0.07, 0.2, 0.1, 0.2], "actor/kl_loss")) == ["proceed"] * 5
    assert g.observe("update", {"actor/kl_loss": 0.2}, 6).action == "adjust"


def test_kl_reward_kl_lowers_lr_and_kl_loss_is_preferred(run, actions):
    g = kl_guard()
    v = run(g, "update", [0.3, 0.3], "actor/reward_kl")
    assert v[1].adjustments == pytest.approx({"lr": 5e-5})  # kl_loss_coef does not act on the in-reward KL
    g = kl_guard()
    v = run(g, "update", [{"actor/kl_loss": 0.01, "actor/reward_kl": 5.0}] * 2)
    assert actions(v) == ["proceed", "proceed"]  # the loss KL is the one that is read
    g = kl_guard(kl_loss_coef=0.0)
    assert run(g, "update", [0.3, 0.3], "actor/kl_loss")[1].adjustments == pytest.approx({"lr": 5e-5})
