"""The ``reward_collapse`` guard: a collapse of the reward (or the validation accuracy) rolled back.

Hand-computed sequences showing exactly when the guard acts and what it returns; the expected values are
worked out in the comment next to them (the running-moment formulas are in ``armor_core/stability/helpers.py``).
"""

from __future__ import annotations

import random

import pytest

from armor_plugins.guards.reward_collapse import RewardCollapseGuard


def test_reward_collapse_hand_computed(run, actions):
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


def test_reward_collapse_validation_is_tracked_separately(run, actions):
    g = RewardCollapseGuard()
    assert actions(run(g, "validation", [0.6, 0.62], "val/acc_greedy")) == ["proceed"] * 2
    # median 0.61, MAD 0.01 -> drop = max(0.1, 0.183, 0.0593) = 0.183, limit 0.427; val_patience 1
    v = g.observe("validation", {"val/acc_greedy": 0.2}, 3)
    assert v.action == "rollback" and v.threshold == pytest.approx(0.427)
    assert v.since == 3  # validation 2 measured the weights of update 2, which were still good
    assert g.tracks["reward"].recent == []
    assert g.observe("validation", {"val/acc_greedy": 0.45}, 4).action == "proceed"


def test_reward_collapse_accepts_a_new_level_after_max_rollbacks(run, actions):
    g = RewardCollapseGuard(window=3, warmup=3, patience=1, min_drop=0.1, rel_drop=0.0, z=0.0, max_rollbacks=2)
    run(g, "reward", [1.0] * 3, "score/mean")  # limit 0.9
    v = run(g, "reward", [0.5, 0.5, 0.5, 0.5], "score/mean")
    assert actions(v) == ["rollback", "rollback", "proceed", "proceed"]
    assert "new level" in v[2].reason
    assert g.tracks["reward"].recent == [0.5, 0.5]


@pytest.mark.parametrize("seed", range(3))
def test_reward_collapse_ignores_noisy_but_stable_rewards(seed, run, actions):
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
