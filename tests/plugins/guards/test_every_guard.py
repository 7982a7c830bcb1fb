"""Every built-in guard: its state round trip at every split continues the run identically, each module
registers its own name and runs in the ``GuardRunner``, and no observation (NaN, inf, extremes) makes one raise
or puts a non-finite number in its state."""

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
    expert_collapse,
    grad_spike,
    importance_ratio,
    kl,
    reward_collapse,
    rollout_mismatch,
    trust_region,
    update_size,
)
from armor_plugins.guards.entropy import EntropyGuard
from armor_plugins.guards.expert_collapse import ExpertCollapseGuard
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
    "expert_collapse": expert_collapse,
}

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
    "expert_collapse": dict(warmup=3, patience=1, max_rollbacks=40, lr=1e-4),
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
    "expert_collapse": ExpertCollapseGuard,
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
                    "moe/load_entropy": rng.choice([0.95, 0.9, 0.97, 0.3]),
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
