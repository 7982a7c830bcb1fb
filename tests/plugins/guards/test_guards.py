"""Stability guards: hand-computed sequences showing exactly when each guard acts and what it returns.

Every expected value below is worked out by hand in the comment next to it (the running-moment
formulas are in ``armor_core/stability/helpers.py``).
"""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from armor_core.stability.guard import GuardRunner
from armor_core.testing import registered
from armor_plugins.guards import (
    entropy,
    grad_spike,
    importance_ratio,
    kl,
    reward_collapse,
    rollout_mismatch,
    trust_region,
    update_size,
)
from armor_plugins.guards.entropy import EntropyGuard
from armor_plugins.guards.grad_spike import GradSpikeGuard
from armor_plugins.guards.importance_ratio import ImportanceRatioGuard
from armor_plugins.guards.kl import KLGuard
from armor_plugins.guards.reward_collapse import RewardCollapseGuard
from armor_plugins.guards.rollout_mismatch import RolloutMismatchGuard
from armor_plugins.guards.trust_region import TrustRegionGuard
from armor_plugins.guards.update_size import UpdateSizeGuard

MODULES = {
    "grad_spike": grad_spike,
    "importance_ratio": importance_ratio,
    "kl": kl,
    "entropy": entropy,
    "reward_collapse": reward_collapse,
    "rollout_mismatch": rollout_mismatch,
    "update_size": update_size,
    "trust_region": trust_region,
}


def run(guard, stage, values, key=None, **extra):
    """Observe ``values`` one per step (as ``{key: v, **extra}``); ``[(action, verdict)]``."""
    out = []
    for i, v in enumerate(values):
        stats = dict(extra)
        if key is not None:
            stats[key] = v
        elif isinstance(v, dict):
            stats.update(v)
        verdict = guard.observe(stage, stats, i + 1)
        out.append(verdict)
    return out


def actions(verdicts):
    return [v.action for v in verdicts]


# -- grad_spike ---------------------------------------------------------------------------------


def test_grad_spike_scales_a_spike_to_mean_plus_k_std():
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


def test_grad_spike_does_not_let_spikes_pollute_the_statistics():
    spiked, clean = (
        GradSpikeGuard(window=4, warmup=4, z_threshold=2.0, min_rel_std=0.0),
        GradSpikeGuard(window=4, warmup=4, z_threshold=2.0, min_rel_std=0.0),
    )
    run(spiked, "grad", [1.0, 3.0, 1.0, 3.0, 1e6], "grad_norm")
    run(clean, "grad", [1.0, 3.0, 1.0, 3.0, 4.0], "grad_norm")  # 4 = the clipped value of the spike
    assert spiked.moments.state_dict() == pytest.approx(clean.moments.state_dict())


def test_grad_spike_clip_z_and_warmup():
    g = GradSpikeGuard(window=4, warmup=4, z_threshold=2.0, clip_z=1.0, min_rel_std=0.0)
    # during warm-up even a huge norm proceeds (no statistics yet)
    assert actions(run(g, "grad", [1.0, 3.0, 1.0], "grad_norm")) == ["proceed"] * 3
    g.observe("grad", {"grad_norm": 3.0}, 4)
    v = g.observe("grad", {"grad_norm": 10.0}, 5)
    assert v.scale == pytest.approx(0.3)  # target = 2 + 1 * 1 = 3
    with pytest.raises(ValueError, match="clip_z"):
        GradSpikeGuard(z_threshold=2.0, clip_z=3.0)


def test_grad_spike_std_floor_after_identical_norms():
    g = GradSpikeGuard(window=10, warmup=4, z_threshold=2.0, min_rel_std=0.05)
    run(g, "grad", [1.0] * 4, "grad_norm")
    # measured std is 0; the floor is 0.05 * 1 = 0.05: z(1.001) = 0.02, z(1.2) = 4 > 2
    assert g.observe("grad", {"grad_norm": 1.001}, 5).action == "proceed"
    v = g.observe("grad", {"grad_norm": 1.2}, 6)
    # before the 1.2: n = 5, mean = 1.0002, var = 4/5 * (0 + 1/5 * 0.001^2) = 1.6e-7, std 4e-4 < floor 0.05001
    # z = 0.1998 / 0.05001 = 3.995; target = 1.0002 + 2 * 0.05001 = 1.10022
    assert v.action == "scale" and v.signal == pytest.approx(0.1998 / 0.05001)
    assert v.scale == pytest.approx(1.10022 / 1.2)


def test_grad_spike_statistics_survive_a_finite_overflow():
    g = GradSpikeGuard(window=4, warmup=4)
    run(g, "grad", [1.0, 3.0], "grad_norm")
    before = g.state_dict()
    # delta**2 = 1e616 overflows: the observation is dropped rather than making var inf
    assert g.observe("grad", {"grad_norm": 1e308}, 3).action == "proceed"
    assert g.state_dict() == before


def test_grad_spike_ignores_non_finite_and_other_stages():
    g = GradSpikeGuard(window=4, warmup=2)
    run(g, "grad", [1.0, 2.0], "grad_norm")
    before = g.state_dict()
    for bad in (float("nan"), float("inf"), -1.0):
        assert g.observe("grad", {"grad_norm": bad}, 3).action == "proceed"
    assert g.observe("update", {"actor/grad_norm": 1e9}, 3).action == "proceed"
    assert g.observe("grad", {"pg_loss": 1.0}, 3).action == "proceed"
    assert g.state_dict() == before


# -- importance_ratio ---------------------------------------------------------------------------

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


def test_importance_ratio_tightens_after_patience_then_floors():
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


def test_importance_ratio_recovers_slowly_to_the_initial_values():
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


def test_importance_ratio_streak_is_broken_by_calm_and_ignores_empty_updates():
    g = ir_guard()
    hot = {**CALM, "actor/ratio_max": 50.0}
    assert actions(run(g, "update", [hot, CALM, hot, {}, {"actor/ratio_max": float("nan")}])) == ["proceed"] * 5
    assert g.hot == 1  # the empty and the non-finite update neither extend nor break the streak
    assert g.observe("update", hot, 6).action == "adjust"


def test_importance_ratio_only_lr():
    g = ir_guard(tighten_clip=False)
    v = run(g, "update", [{"actor/ratio_min": 0.01}] * 2)
    assert v[1].adjustments == pytest.approx({"lr": 5e-5})
    with pytest.raises(ValueError, match="tighten_clip and lower_lr"):
        ir_guard(tighten_clip=False, lower_lr=False)


# -- kl -----------------------------------------------------------------------------------------


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


def test_kl_raises_the_coefficient_then_lowers_lr_then_rolls_back():
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


def test_kl_boundary_hysteresis_and_recovery():
    g = kl_guard()
    run(g, "update", [0.2] * 6, "actor/kl_loss")  # coef 0.004, lr 5e-5
    # exactly at the target is not above it; between 0.05 and 0.1 is neither hot nor calm
    assert actions(run(g, "update", [0.1, 0.07, 0.1, 0.07], "actor/kl_loss")) == ["proceed"] * 4
    v = run(g, "update", [0.01] * 6, "actor/kl_loss")
    assert actions(v) == ["proceed", "adjust"] * 2 + ["proceed"] * 2
    assert v[1].adjustments == pytest.approx({"kl_loss_coef": 0.002, "lr": 1e-4})
    assert v[3].adjustments == pytest.approx({"kl_loss_coef": 0.001})  # lr back at its initial value already
    assert v[1].threshold == pytest.approx(0.05)


def test_kl_streak_is_broken_by_a_value_at_or_below_target():
    g = kl_guard()
    assert actions(run(g, "update", [0.2, 0.07, 0.2, 0.1, 0.2], "actor/kl_loss")) == ["proceed"] * 5
    assert g.observe("update", {"actor/kl_loss": 0.2}, 6).action == "adjust"


def test_kl_reward_kl_lowers_lr_and_kl_loss_is_preferred():
    g = kl_guard()
    v = run(g, "update", [0.3, 0.3], "actor/reward_kl")
    assert v[1].adjustments == pytest.approx({"lr": 5e-5})  # kl_loss_coef does not act on the in-reward KL
    g = kl_guard()
    v = run(g, "update", [{"actor/kl_loss": 0.01, "actor/reward_kl": 5.0}] * 2)
    assert actions(v) == ["proceed", "proceed"]  # the loss KL is the one that is read
    g = kl_guard(kl_loss_coef=0.0)
    assert run(g, "update", [0.3, 0.3], "actor/kl_loss")[1].adjustments == pytest.approx({"lr": 5e-5})


# -- entropy ------------------------------------------------------------------------------------


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


def test_entropy_collapse_raises_coefficient_then_widens_clip():
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


def test_entropy_explosion_takes_back_what_was_given():
    g = ent_guard()
    run(g, "update", [0.05] * 8, "actor/entropy")  # entropy_coeff 0.002, clip_ratio_high 0.28
    v = run(g, "update", [1.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0], "actor/entropy")
    assert actions(v) == ["proceed", "proceed", "adjust", "proceed", "adjust", "proceed", "proceed"]
    assert v[2].adjustments == pytest.approx({"entropy_coeff": 0.001, "clip_ratio_high": 0.24})
    assert v[4].adjustments == pytest.approx({"entropy_coeff": 0.0, "clip_ratio_high": 0.2})
    assert (v[2].signal, v[2].threshold) == (3.0, 2.0)


def test_entropy_options():
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


# -- update_size --------------------------------------------------------------------------------


def test_update_size_skips_a_spike_against_the_recent_median():
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


# -- reward_collapse ----------------------------------------------------------------------------


def test_reward_collapse_hand_computed():
    g = RewardCollapseGuard(window=5, warmup=3, patience=2, min_drop=0.1, rel_drop=0.3, z=4.0)
    assert actions(run(g, "reward", [0.5, 0.52, 0.48], "score/mean")) == ["proceed"] * 3  # warm-up
    # history [0.5, 0.52, 0.48]: median 0.5, MAD 0.02, spread 0.029652; drop = max(0.1, 0.15, 0.1186) = 0.15
    v = run(g, "reward", [0.34, 0.51, 0.2, 0.1], "score/mean")
    # 0.34 < 0.35: first low; 0.51 breaks the streak and joins the history
    # history [0.5, 0.52, 0.48, 0.51]: median 0.505, MAD 0.01 -> drop = max(0.1, 0.1515, 0.0593) = 0.1515, limit 0.3535
    assert actions(v) == ["proceed", "proceed", "proceed", "rollback"]
    assert v[3].signal == 0.1 and v[3].threshold == pytest.approx(0.3535)
    assert g.tracks["reward"].recent == [0.5, 0.52, 0.48, 0.51]  # collapsed values stay out
    assert g.tracks["reward"].rollbacks == 1
    # the last good reward (step 2) was sampled with the weights of update 1: update 2 is the first suspect
    assert v[3].since == 2


def test_reward_collapse_validation_is_tracked_separately():
    g = RewardCollapseGuard()
    assert actions(run(g, "validation", [0.6, 0.62], "val/acc_greedy")) == ["proceed"] * 2
    # median 0.61, MAD 0.01 -> drop = max(0.1, 0.183, 0.0593) = 0.183, limit 0.427; val_patience 1
    v = g.observe("validation", {"val/acc_greedy": 0.2}, 3)
    assert v.action == "rollback" and v.threshold == pytest.approx(0.427)
    assert v.since == 3  # validation 2 measured the weights of update 2, which were still good
    assert g.tracks["reward"].recent == []
    assert g.observe("validation", {"val/acc_greedy": 0.45}, 4).action == "proceed"


def test_reward_collapse_accepts_a_new_level_after_max_rollbacks():
    g = RewardCollapseGuard(window=3, warmup=3, patience=1, min_drop=0.1, rel_drop=0.0, z=0.0, max_rollbacks=2)
    run(g, "reward", [1.0] * 3, "score/mean")  # limit 0.9
    v = run(g, "reward", [0.5, 0.5, 0.5, 0.5], "score/mean")
    assert actions(v) == ["rollback", "rollback", "proceed", "proceed"]
    assert "new level" in v[2].reason
    assert g.tracks["reward"].recent == [0.5, 0.5]


@pytest.mark.parametrize("seed", range(3))
def test_reward_collapse_ignores_noisy_but_stable_rewards(seed):
    rng = random.Random(seed)
    g = RewardCollapseGuard()  # defaults
    # batch means of 64 Bernoulli(p) samples (std ~0.06), p drifting slowly up, 1000 steps
    for step in range(1000):
        p = 0.2 + 0.5 * step / 1000
        mean = sum(rng.random() < p for _ in range(64)) / 64
        assert g.observe("reward", {"score/mean": mean}, step).action == "proceed", (step, mean)
    # gaussian noise with std 0.1 around 0.5
    g = RewardCollapseGuard()
    for step in range(1000):
        assert g.observe("reward", {"score/mean": rng.gauss(0.5, 0.1)}, step).action == "proceed"
    # ... and the same history does catch a real collapse, after `patience` (3) batches
    assert actions(run(g, "reward", [0.02, 0.0, 0.01], "score/mean")) == ["proceed", "proceed", "rollback"]


# -- rollout_mismatch ---------------------------------------------------------------------------


def test_rollout_mismatch_guard():
    g = RolloutMismatchGuard(max_diff_mean=0.2)
    assert (
        g.observe("advantage", {"rollout/logprob_diff_mean": 0.1, "rollout/logprob_diff_max": 9.0}, 1).action
        == "proceed"
    )
    v = g.observe("advantage", {"rollout/logprob_diff_mean": 0.3}, 2)
    assert (v.action, v.signal, v.threshold) == ("skip", 0.3, 0.2)
    g = RolloutMismatchGuard(max_diff_mean=0.2, max_diff_max=5.0)
    v = g.observe("grad", {"rollout/logprob_diff_mean": 0.1, "rollout/logprob_diff_max": 9.0}, 1)
    assert (v.action, v.signal) == ("skip", 9.0)
    assert g.state_dict() == {"skips": 1}


def test_rollout_mismatch_acts_only_before_the_update_is_made():
    """At ``update`` the same statistics arrive again, but a skip there could not be carried out."""
    g = RolloutMismatchGuard(max_diff_mean=0.2)
    assert g.observe("update", {"rollout/logprob_diff_mean": 0.9}, 1).action == "proceed"
    with registered(rollout_mismatch, load_entrypoints=False) as pm:
        runner = GuardRunner([{"name": "rollout_mismatch"}], pm=pm)
        assert runner.observe("update", {"rollout/logprob_diff_mean": 0.9}, 1).action == "proceed"
        assert runner.observe("advantage", {"rollout/logprob_diff_mean": 0.9}, 2).action == "skip"
    assert runner.pop_metrics() == {"guard/rollout_mismatch/skip": 1.0}


# -- trust_region -------------------------------------------------------------------------------


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
    state = {"ceiling": lr, "quiet": 2, "last_lr": lr, "batch_step": 8, "batch_kl": 0.001, "batch_calm": True}
    assert g.state_dict() == state
    resumed = TrustRegionGuard(target_kl=0.03, lr=5e-4)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state


def test_trust_region_holds_a_batchs_steps_together_to_the_skip_line():
    g = TrustRegionGuard(target_kl=0.05, lr=1e-3)  # the skip line: 2 x 0.05 = 0.1 nats/token
    v = g.observe("step", {"policy_kl": 0.08, "lr": 1e-3}, 1)  # under the line: stands, lr * sqrt(0.025 / 0.08)
    assert v.action == "adjust" and v.adjustments["lr"] == pytest.approx(1e-3 * math.sqrt(0.025 / 0.08), rel=1e-9)
    lr = v.adjustments["lr"]
    v = g.observe("step", {"policy_kl": 0.06, "lr": lr}, 1)  # 0.14 with the first: undone, lr * 0.025 / 0.06
    assert v.action == "skip" and v.signal == pytest.approx(0.14) and v.threshold == pytest.approx(0.1)
    assert v.adjustments["lr"] == pytest.approx(lr * 0.025 / 0.06, rel=1e-9) and "0.14 with this batch" in v.reason
    lr = v.adjustments["lr"]
    v = g.observe("step", {"policy_kl": 0.021, "lr": lr}, 1)  # small, but the batch has spent its budget: undone too
    assert v.action == "skip" and v.adjustments == {}
    assert g.observe("step", {"policy_kl": 0.021, "lr": lr}, 2).action == "proceed"  # a new batch, a new budget
    assert g.state_dict()["batch_step"] == 2 and g.state_dict()["batch_kl"] == pytest.approx(0.021)
    # several small steps on one batch add up to the line as well (8 optimizer steps per batch)
    g = TrustRegionGuard(target_kl=0.05, lr=1e-3)
    actions = [g.observe("step", {"policy_kl": 0.03, "lr": 1e-3}, 1).action for _ in range(4)]
    assert actions == ["proceed"] * 3 + ["skip"]


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
    assert TrustRegionGuard.needs == ("policy_kl",) and TrustRegionGuard.stages == ("step",)


# -- every guard --------------------------------------------------------------------------------

# small windows and patience so that each guard acts within a short, turbulent run
ACTIVE = {
    "grad_spike": dict(window=5, warmup=3, z_threshold=1.5),
    "importance_ratio": dict(patience=2, recover_every=2, max_clipfrac=0.1),
    "kl": dict(target=0.1, patience=1, recover_every=2, rollback_factor=5.0),
    "entropy": dict(floor=0.3, ceiling=3.0, patience=2),
    "reward_collapse": dict(window=6, warmup=3, patience=2, val_warmup=1, z=1.0, rel_drop=0.1, max_rollbacks=2),
    "rollout_mismatch": dict(max_diff_mean=0.2),
    "update_size": dict(warmup=3, window=5, max_ratio=2e-3),
    "trust_region": dict(target_kl=0.01, lr=1e-4),
}
CLASSES = {
    "grad_spike": GradSpikeGuard,
    "importance_ratio": ImportanceRatioGuard,
    "kl": KLGuard,
    "entropy": EntropyGuard,
    "reward_collapse": RewardCollapseGuard,
    "rollout_mismatch": RolloutMismatchGuard,
    "update_size": UpdateSizeGuard,
    "trust_region": TrustRegionGuard,
}


def turbulent(seed, n):
    """Deterministic stage/stats sequence with spikes, runaway ratios, KL and entropy excursions, reward drops."""
    rng, step_rng = random.Random(seed), random.Random(seed + 1000)
    out = []
    for step in range(1, n + 1):
        out.append(
            ("reward", {"score/mean": rng.choice([0.6, 0.65, 0.7, 0.1]), "score/min": 0.0, "score/max": 1.0}, step)
        )
        out.append(
            ("advantage", {"critic/advantages/mean": 0.0, "rollout/logprob_diff_mean": rng.choice([0.01, 0.3])}, step)
        )
        out.append(("grad", {"grad_norm": rng.choice([1.0, 1.2, 0.9, 30.0]), "pg_loss": 0.1}, step))
        out.append(
            (
                "update",
                {
                    "actor/pg_clipfrac": rng.choice([0.0, 0.3]),
                    "actor/pg_clipfrac_lower": 0.0,
                    "actor/ratio_max": rng.choice([1.5, 20.0]),
                    "actor/ratio_min": 0.5,
                    "actor/kl_loss": rng.choice([0.01, 0.2, 0.8]),
                    "actor/entropy": rng.choice([0.1, 1.0, 5.0]),
                    "rollout/logprob_diff_mean": rng.choice([0.01, 0.5]),
                },
                step,
            )
        )
        kl = step_rng.choice([1e-4, 1e-3, 2e-3, 0.02, 0.5])
        lr = 1e-4 * step_rng.choice([1.0, 0.5, 0.1])  # the rate a guard set earlier
        out.append(
            (
                "step",
                {"update_ratio": step_rng.choice([1e-3, 1.2e-3, 0.9e-3, 3e-3, 0.05]), "policy_kl": kl, "lr": lr},
                step,
            )
        )
        if step % 4 == 0:
            out.append(("validation", {"val/acc_greedy": rng.choice([0.7, 0.72, 0.2])}, step))
    return out


@pytest.mark.parametrize("name", list(CLASSES))
def test_state_round_trip_continues_identically(name):
    seq = turbulent(7, 40)
    full = CLASSES[name](**ACTIVE[name])
    expected = [full.observe(*x) for x in seq]
    assert any(v.action != "proceed" for v in expected[80:]), (
        f"{name} never acted late in the run: the test would prove nothing"
    )
    for split in range(0, len(seq), 5):  # every 5th point, so the split falls inside streaks and warm-ups too
        a = CLASSES[name](**ACTIVE[name])
        for x in seq[:split]:
            a.observe(*x)
        b = CLASSES[name](**ACTIVE[name])
        b.load_state_dict(json.loads(json.dumps(a.state_dict(), allow_nan=False)))  # what the checkpoint stores
        assert [b.observe(*x) for x in seq[split:]] == expected[split:], f"{name} diverges after a restore at {split}"
        assert b.state_dict() == full.state_dict()


@pytest.mark.parametrize("name", list(MODULES))
def test_each_module_registers_its_own_name_and_runs_in_the_runner(name, tmp_path):
    with registered(MODULES[name], load_entrypoints=False) as pm:
        assert pm.names("stability_guard") == [name]
        runner = GuardRunner([{"name": name, "params": ACTIVE[name]}], pm=pm, run_dir=tmp_path)
        for stage, stats, step in turbulent(3, 30):
            runner.observe(stage, stats, step)
    events = [json.loads(line) for line in (tmp_path / "guard_events.jsonl").read_text().splitlines()]
    assert events and {e["guard"] for e in events} == {name}
    with pytest.raises(ValueError, match=name):
        CLASSES[name](**{next(iter(ACTIVE[name])): -1})  # every guard validates its first parameter


FLOATS = st.one_of(
    st.floats(), st.sampled_from([0.0, -0.0, 1e308, -1e308, 5e-324, float("nan"), float("inf"), -float("inf")])
)
KEYS = [
    "grad_norm",
    "score/mean",
    "val/acc_greedy",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ratio_max",
    "actor/ratio_min",
    "actor/kl_loss",
    "actor/reward_kl",
    "actor/entropy",
    "rollout/logprob_diff_mean",
    "rollout/logprob_diff_max",
    "update_ratio",
    "policy_kl",
    "lr",
]
STAGES = ["reward", "advantage", "grad", "step", "update", "validation"]


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(list(CLASSES)),
    st.lists(
        st.tuples(st.sampled_from(STAGES), st.dictionaries(st.sampled_from(KEYS), FLOATS, max_size=6)), max_size=40
    ),
)
def test_guards_never_raise_and_keep_finite_state(name, seq):
    g = CLASSES[name](**ACTIVE[name])
    for step, (stage, stats) in enumerate(seq, 1):
        v = g.observe(stage, stats, step)
        assert v.action in ("proceed", "skip", "scale", "adjust", "rollback")
        assert all(math.isfinite(x) for x in v.adjustments.values())
        if v.action == "scale":
            assert 0.0 <= v.scale <= 1.0
    json.dumps(g.state_dict(), allow_nan=False)  # no NaN or Inf ever reaches the state


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(list(CLASSES)),
    st.lists(st.tuples(st.sampled_from(STAGES), st.booleans()), max_size=60),
    st.sampled_from([float("nan"), float("inf"), -float("inf")]),
)
def test_non_finite_observations_leave_the_state_untouched(name, plan, bad):
    """The same run with non-finite observations interleaved ends in the same state as without them."""
    clean, dirty = CLASSES[name](**ACTIVE[name]), CLASSES[name](**ACTIVE[name])
    seq = turbulent(11, 15)
    for i, (stage, insert_bad) in enumerate(plan):
        if insert_bad:
            dirty.observe(stage, dict.fromkeys(KEYS, bad), i)
        s = seq[i % len(seq)]
        assert clean.observe(*s) == dirty.observe(*s)
    assert clean.state_dict() == dirty.state_dict()
