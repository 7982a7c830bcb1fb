"""The ``entropy`` guard: entropy collapse and explosion, and what each undoes.

Hand-computed sequences showing exactly when the guard acts and what it returns; the expected values are
worked out in the comment next to them.
"""

from __future__ import annotations

import pytest

from armor_plugins.guards.entropy import EntropyGuard


def ent_guard(**kw):
    params = dict(
        floor=0.1,
        ceiling=2.0,
        patience=2,
        coeff_step=0.001,
        max_entropy_coeff=0.002,
        clip_step=0.04,
        max_clip_ratio_high=0.28,
        entropy_coeff=0.0,
        clip_ratio_high=0.2,
    )
    params.update(kw)
    return EntropyGuard(**params)


def test_entropy_collapse_raises_coefficient_then_widens_clip(run, actions):
    g = ent_guard()
    v = run(g, "update", [0.05] * 10, "actor/entropy")
    assert actions(v) == ["proceed", "adjust"] * 4 + ["proceed"] * 2
    assert [v[i].adjustments for i in (1, 3, 5, 7)] == [
        pytest.approx({"entropy_coeff": 0.001}),
        pytest.approx({"entropy_coeff": 0.002}),
        pytest.approx({"clip_ratio_high": 0.24}),
        pytest.approx({"clip_ratio_high": 0.28}),
    ]
    assert (v[1].signal, v[1].threshold) == (0.05, 0.1)


def test_entropy_explosion_takes_back_what_was_given(run, actions):
    g = ent_guard()
    run(g, "update", [0.05] * 8, "actor/entropy")  # entropy_coeff 0.002, clip_ratio_high 0.28
    v = run(g, "update", [1.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0], "actor/entropy")
    assert actions(v) == ["proceed", "proceed", "adjust", "proceed", "adjust", "proceed", "proceed"]
    assert v[2].adjustments == pytest.approx({"entropy_coeff": 0.001, "clip_ratio_high": 0.24})
    assert v[4].adjustments == pytest.approx({"entropy_coeff": 0.0, "clip_ratio_high": 0.2})
    assert (v[2].signal, v[2].threshold) == (3.0, 2.0)


def test_entropy_options(run, actions):
    g = ent_guard(remedies=["clip_ratio_high"], ceiling=None)
    assert run(g, "update", [0.0, 0.0], "actor/entropy")[1].adjustments == pytest.approx({"clip_ratio_high": 0.24})
    assert actions(run(g, "update", [100.0] * 4, "actor/entropy")) == ["proceed"] * 4  # no ceiling
    g = ent_guard()
    # a value back in the band breaks the streak
    assert actions(run(g, "update", [0.05, 0.5, 0.05, float("nan")], "actor/entropy")) == ["proceed"] * 4
    with pytest.raises(ValueError, match="remedies"):
        ent_guard(remedies=["lr"])
    with pytest.raises(ValueError, match="ceiling"):
        ent_guard(floor=1.0, ceiling=0.5)
