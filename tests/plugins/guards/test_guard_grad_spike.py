"""The ``grad_spike`` guard: a gradient-norm spike scaled to mean + k std, its statistics kept clean.

Hand-computed sequences showing exactly when the guard acts and what it returns; the expected values are
worked out in the comment next to them (the running-moment formulas are in ``armor_core/stability/helpers.py``).
"""

from __future__ import annotations

import pytest

from armor_plugins.guards.grad_spike import GradSpikeGuard


def test_grad_spike_scales_a_spike_to_mean_plus_k_std(run, actions):
    g = GradSpikeGuard(window=4, warmup=4, z_threshold=2.0, min_rel_std=0.0)
    # norms 1, 3, 1, 3: mean 2, population variance 1 (exact while n <= window)
    assert actions(run(g, "grad", [1.0, 3.0, 1.0, 3.0], "grad_norm")) == ["proceed"] * 4
    assert g.moments.n == 4 and g.moments.mean == pytest.approx(2.0) and g.moments.var == pytest.approx(1.0)
    v = g.observe("grad", {"grad_norm": 10.0, "pg_loss": 0.1}, 5)
    # z = (10 - 2) / 1 = 8 > 2; target = 2 + 2 * 1 = 4; scale = 4 / 10
    assert v.action == "scale" and v.scale == pytest.approx(0.4)
    assert v.signal == pytest.approx(8.0) and v.threshold == 2.0
    # the spike enters the statistics as 4, not 10: alpha = max(1/5, 1/4) = 1/4, delta = 2,
    # mean = 2 + 2/4 = 2.5, var = 3/4 * (1 + 1/4 * 4) = 1.5
    assert g.moments.mean == pytest.approx(2.5) and g.moments.var == pytest.approx(1.5)
    # z = (3 - 2.5) / sqrt(1.5) = 0.41: ordinary
    assert g.observe("grad", {"grad_norm": 3.0}, 6).action == "proceed"


def test_grad_spike_does_not_let_spikes_pollute_the_statistics(run):
    spiked, clean = (
        GradSpikeGuard(window=4, warmup=4, z_threshold=2.0, min_rel_std=0.0),
        GradSpikeGuard(window=4, warmup=4, z_threshold=2.0, min_rel_std=0.0),
    )
    run(spiked, "grad", [1.0, 3.0, 1.0, 3.0, 1e6], "grad_norm")
    run(clean, "grad", [1.0, 3.0, 1.0, 3.0, 4.0], "grad_norm")  # 4 = the clipped value of the spike
    assert spiked.moments.state_dict() == pytest.approx(clean.moments.state_dict())


def test_grad_spike_clip_z_and_warmup(run, actions):
    g = GradSpikeGuard(window=4, warmup=4, z_threshold=2.0, clip_z=1.0, min_rel_std=0.0)
    # during warm-up even a huge norm proceeds (no statistics yet)
    assert actions(run(g, "grad", [1.0, 3.0, 1.0], "grad_norm")) == ["proceed"] * 3
    g.observe("grad", {"grad_norm": 3.0}, 4)
    v = g.observe("grad", {"grad_norm": 10.0}, 5)
    assert v.scale == pytest.approx(0.3)  # target = 2 + 1 * 1 = 3
    with pytest.raises(ValueError, match="clip_z"):
        GradSpikeGuard(z_threshold=2.0, clip_z=3.0)


def test_grad_spike_std_floor_after_identical_norms(run):
    g = GradSpikeGuard(window=10, warmup=4, z_threshold=2.0, min_rel_std=0.05)
    run(g, "grad", [1.0] * 4, "grad_norm")
    # measured std is 0; the floor is 0.05 * 1 = 0.05: z(1.001) = 0.02, z(1.2) = 4 > 2
    assert g.observe("grad", {"grad_norm": 1.001}, 5).action == "proceed"
    v = g.observe("grad", {"grad_norm": 1.2}, 6)
    # before the 1.2: n = 5, mean = 1.0002, var = 4/5 * (0 + 1/5 * 0.001^2) = 1.6e-7, std 4e-4 < floor 0.05001
    # z = 0.1998 / 0.05001 = 3.995; target = 1.0002 + 2 * 0.05001 = 1.10022
    assert v.action == "scale" and v.signal == pytest.approx(0.1998 / 0.05001)
    assert v.scale == pytest.approx(1.10022 / 1.2)


def test_grad_spike_statistics_survive_a_finite_overflow(run):
    g = GradSpikeGuard(window=4, warmup=4)
    run(g, "grad", [1.0, 3.0], "grad_norm")
    before = g.state_dict()
    # delta**2 = 1e616 overflows: the observation is dropped rather than making var inf
    assert g.observe("grad", {"grad_norm": 1e308}, 3).action == "proceed"
    assert g.state_dict() == before


def test_grad_spike_ignores_non_finite_and_other_stages(run):
    g = GradSpikeGuard(window=4, warmup=2)
    run(g, "grad", [1.0, 2.0], "grad_norm")
    before = g.state_dict()
    for bad in (float("nan"), float("inf"), -1.0):
        assert g.observe("grad", {"grad_norm": bad}, 3).action == "proceed"
    assert g.observe("update", {"actor/grad_norm": 1e9}, 3).action == "proceed"
    assert g.observe("grad", {"pg_loss": 1.0}, 3).action == "proceed"
    assert g.state_dict() == before
