"""The ``importance_ratio`` guard: clip range tightened after a streak of clipping or runaway ratios, then recovered.

Hand-computed sequences showing exactly when the guard acts and what it returns; the expected values are
worked out in the comment next to them.
"""

from __future__ import annotations

import pytest

from armor_plugins.guards.importance_ratio import ImportanceRatioGuard

CALM = {"actor/pg_clipfrac": 0.01, "actor/pg_clipfrac_lower": 0.0, "actor/ratio_max": 2.0, "actor/ratio_min": 0.5}


def ir_guard(**kw):
    params = dict(
        max_clipfrac=0.1,
        max_ratio=10.0,
        min_ratio=0.1,
        patience=2,
        tighten_factor=0.5,
        lr_factor=0.5,
        clip_ratio_floor=0.05,
        min_lr_scale=0.25,
        recover_every=2,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        lr=1e-4,
    )
    params.update(kw)
    return ImportanceRatioGuard(**params)


def test_importance_ratio_tightens_after_patience_then_floors(run, actions):
    g = ir_guard()
    hot_frac = {**CALM, "actor/pg_clipfrac": 0.08, "actor/pg_clipfrac_lower": 0.04}  # 0.12 > 0.1
    hot_max = {**CALM, "actor/ratio_max": 12.0}
    hot_min = {**CALM, "actor/ratio_min": 0.05}
    v = run(g, "update", [hot_frac, hot_max])
    assert actions(v) == ["proceed", "adjust"]
    assert v[1].adjustments == pytest.approx({"clip_ratio_low": 0.1, "clip_ratio_high": 0.14, "lr": 5e-5})
    assert (v[1].signal, v[1].threshold) == (12.0, 10.0)
    v = run(g, "update", [hot_min, {**CALM, "actor/pg_clipfrac": 0.2}])
    assert actions(v) == ["proceed", "adjust"]
    assert v[1].adjustments == pytest.approx({"clip_ratio_low": 0.05, "clip_ratio_high": 0.07, "lr": 2.5e-5})
    assert (v[1].signal, v[1].threshold) == pytest.approx((0.2, 0.1))
    # next cut: low 0.025 -> floor 0.05 (unchanged), high 0.035 -> floor 0.05, lr 1.25e-5 -> floor 2.5e-5 (unchanged)
    v = run(g, "update", [hot_max, hot_max])
    assert v[1].adjustments == pytest.approx({"clip_ratio_high": 0.05})
    # everything at its floor: nothing left to do
    assert actions(run(g, "update", [hot_max, hot_max])) == ["proceed", "proceed"]


def test_importance_ratio_recovers_slowly_to_the_initial_values(run, actions):
    g = ir_guard()
    run(g, "update", [{**CALM, "actor/ratio_max": 50.0}] * 6)  # three cuts: low 0.05, high 0.05, lr 2.5e-5
    assert {n: k.value for n, k in g.knobs.items()} == pytest.approx(
        {"clip_ratio_low": 0.05, "clip_ratio_high": 0.05, "lr": 2.5e-5}
    )
    v = run(g, "update", [CALM] * 8)
    assert actions(v) == ["proceed", "adjust"] * 3 + ["proceed", "proceed"]
    assert v[1].adjustments == pytest.approx({"clip_ratio_low": 0.1, "clip_ratio_high": 0.1, "lr": 5e-5})
    assert v[3].adjustments == pytest.approx({"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "lr": 1e-4})
    assert v[5].adjustments == pytest.approx({"clip_ratio_high": 0.28})  # low and lr are back at their initial values


def test_importance_ratio_streak_is_broken_by_calm_and_ignores_empty_updates(run, actions):
    g = ir_guard()
    hot = {**CALM, "actor/ratio_max": 50.0}
    assert actions(run(g, "update", [hot, CALM, hot, {}, {"actor/ratio_max": float("nan")}])) == ["proceed"] * 5
    assert g.hot == 1  # the empty and the non-finite update neither extend nor break the streak
    assert g.observe("update", hot, 6).action == "adjust"


def test_importance_ratio_only_lr(run):
    g = ir_guard(tighten_clip=False)
    v = run(g, "update", [{"actor/ratio_min": 0.01}] * 2)
    assert v[1].adjustments == pytest.approx({"lr": 5e-5})
    with pytest.raises(ValueError, match="tighten_clip and lower_lr"):
        ir_guard(tighten_clip=False, lower_lr=False)
