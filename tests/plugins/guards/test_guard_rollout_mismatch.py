"""The ``rollout_mismatch`` guard: the gap between the rollout's and the trained policy's log-probs.

Hand-computed sequences showing exactly when the guard acts and what it returns; the expected values are
worked out in the comment next to them.
"""

from __future__ import annotations

from armor_core.stability.guard import GuardRunner
from armor_core.testing import registered
from armor_plugins.guards import (
    rollout_mismatch,
)
from armor_plugins.guards.rollout_mismatch import RolloutMismatchGuard


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
