"""Advantage estimators: hand-computed cases, edge cases, group-id types, and resolution through the plugin manager."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from armor_core.interfaces import call_with_params
from armor_core.plugins import DuplicatePluginError, PluginManager
from armor_plugins.advantages.gae import compute_gae_advantage
from armor_plugins.advantages.grpo import compute_dr_grpo_advantage, compute_grpo_advantage
from armor_plugins.advantages.opo import compute_opo_advantage
from armor_plugins.advantages.pass_at_k import compute_pass_at_k_advantage
from armor_plugins.advantages.reinforce_plus_plus import (
    compute_reinforce_plus_plus_advantage,
    compute_reinforce_plus_plus_baseline_advantage,
)
from armor_plugins.advantages.rloo import compute_rloo_advantage

GROUP_ESTIMATORS = [
    compute_grpo_advantage,
    compute_dr_grpo_advantage,
    compute_rloo_advantage,
    compute_opo_advantage,
    compute_reinforce_plus_plus_baseline_advantage,
]


def outcome_batch(scores, lengths, T=4):
    """Rewards on the last valid token of each row, right-padded masks."""
    bs = len(scores)
    rewards = torch.zeros(bs, T)
    mask = torch.zeros(bs, T)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        if n:
            rewards[i, n - 1] = s
    return rewards, mask


def row_values(adv, mask):
    """The single per-row value of an outcome advantage, checking it is constant on valid tokens and 0 elsewhere."""
    out = []
    for a, m in zip(adv, mask.bool()):
        assert torch.all(a[~m] == 0)
        vals = a[m]
        if vals.numel():
            assert torch.allclose(vals, vals[0].expand_as(vals))
        out.append(float(vals[0]) if vals.numel() else 0.0)
    return out


def assert_close(actual, expected, atol=1e-6):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# -- GRPO / Dr. GRPO ------------------------------------------------------------------------------


def test_grpo_hand_computed_with_edge_cases():
    # group 0: rewards 1,0,0,1 (+ one fully masked row with a stray reward that must be ignored)
    # group 1: 2,2 (all equal); group 2: a singleton
    rewards, mask = outcome_batch([1, 0, 0, 1, 0, 2, 2, 5], [1, 4, 2, 3, 0, 2, 2, 3])
    rewards[4, 2] = 100.0  # outside the mask
    index = torch.tensor([0, 0, 0, 0, 0, 1, 1, 2])
    adv, ret = compute_grpo_advantage(rewards, mask, index)
    # mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3); 0.5 / sqrt(1/3) = 0.8660254
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert row_values(adv, mask) == pytest.approx([a, -a, -a, a, 0, 0, 0, 0], abs=1e-6)
    assert torch.equal(adv, ret)
    # no signal means exactly zero, not float noise
    assert torch.all(adv[4:] == 0)


def test_dr_grpo_is_grpo_without_std_both_ways():
    rewards, mask = outcome_batch([1.0, 0.0, 0.0, 3.0], [2, 3, 1, 4])
    index = np.array([7, 7, 9, 9])
    adv, _ = compute_dr_grpo_advantage(rewards, mask, index)
    assert row_values(adv, mask) == pytest.approx([0.5, -0.5, -1.5, 1.5])
    adv2, _ = compute_grpo_advantage(rewards, mask, index, norm_adv_by_std=False)
    assert torch.equal(adv, adv2)


def test_equal_rewards_with_inexact_mean_still_give_exact_zero():
    # 0.1 * 3 / 3 != 0.1 in floating point: the no-signal rule must not depend on the mean being exact
    rewards, mask = outcome_batch([0.1, 0.1, 0.1, 0.7, 0.7, 0.7], [1, 2, 3, 1, 2, 3])
    index = [0, 0, 0, 1, 1, 1]
    for fn in GROUP_ESTIMATORS:
        adv, ret = fn(rewards, mask, index)
        assert torch.all(adv == 0) and torch.all(ret == 0), fn.__name__
    adv, _ = compute_pass_at_k_advantage(rewards, mask, index, k=2)
    assert torch.all(adv == 0)


def test_group_ids_of_every_type_give_the_same_result():
    rewards, mask = outcome_batch([1, 0, 3, 1, 2], [1, 2, 3, 4, 1])
    expected, _ = compute_grpo_advantage(rewards, mask, torch.tensor([5, 5, 2, 2, 2]))
    for index in (
        np.array([5, 5, 2, 2, 2]),
        [5, 5, 2, 2, 2],
        np.array(["b", "b", "a", "a", "a"], dtype=object),
        torch.tensor([5, 5, 2, 2, 2], dtype=torch.int32),
    ):
        adv, _ = compute_grpo_advantage(rewards, mask, index)
        assert torch.equal(adv, expected)


def test_index_of_the_wrong_length_is_a_clear_error():
    rewards, mask = outcome_batch([1, 0], [1, 1])
    with pytest.raises(ValueError, match="index has 3 entries.*2 rows"):
        compute_grpo_advantage(rewards, mask, torch.tensor([0, 0, 1]))


# -- RLOO, OPO ------------------------------------------------------------------------------------


def test_rloo_hand_computed():
    rewards, mask = outcome_batch([1, 0, 0, 1, 3, 1, 2, 4], [1, 2, 3, 4, 2, 2, 2, 3])
    index = [0, 0, 0, 0, 1, 1, 1, 2]
    adv, ret = compute_rloo_advantage(rewards, mask, index)
    # group 0: 1 - (0+0+1)/3 = 2/3, 0 - 2/3; group 1: 3 - 1.5, 1 - 2.5, 2 - 2; singleton: no baseline -> 0
    assert row_values(adv, mask) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, 1.5, -1.5, 0.0, 0.0])
    assert torch.equal(adv, ret)


def test_opo_length_weighted_baseline():
    rewards, mask = outcome_batch([1, 0, 1, 2], [1, 3, 2, 4])
    index = [0, 0, 0, 1]
    adv, _ = compute_opo_advantage(rewards, mask, index)
    # b = (1*1 + 3*0 + 2*1) / (1+3+2) = 0.5; the unweighted mean would be 2/3
    assert row_values(adv, mask) == pytest.approx([0.5, -0.5, 0.5, 0.0])


# -- REINFORCE++ ----------------------------------------------------------------------------------


def whiten_by_hand(xs):
    n = len(xs)
    mean = sum(xs) / n
    var = sum((x - mean) ** 2 for x in xs) / (n - 1)
    return [(x - mean) / math.sqrt(var + 1e-8) for x in xs]


def test_reinforce_plus_plus_discounts_then_whitens_globally():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_reinforce_plus_plus_advantage(rewards, mask, None, gamma=0.5)
    assert_close(ret, [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]], atol=1e-6)
    w = whiten_by_hand([0.25, 0.5, 1.0, 1.0, 2.0])  # mean 0.95, unbiased var 0.45
    assert_close(adv, [w[:3], [w[3], w[4], 0.0]], atol=1e-6)


def test_reinforce_plus_plus_skips_masked_positions_inside_a_response():
    # position 1 is tool output: not a time step, its reward ignored, the return passes through
    rewards = torch.tensor([[1.0, 7.0, 1.0]])
    mask = torch.tensor([[1, 0, 1]])
    _, ret = compute_reinforce_plus_plus_advantage(rewards, mask, None, gamma=0.5)
    assert_close(ret, [[1.5, 0.0, 1.0]], atol=1e-6)


def test_reinforce_plus_plus_baseline_hand_computed():
    # group 0: rewards 1, 0 with lengths 2, 1 -> centred 0.5, -0.5; group 1: 1, 1 -> no signal
    rewards, mask = outcome_batch([1, 0, 1, 1], [2, 1, 1, 1])
    adv, ret = compute_reinforce_plus_plus_baseline_advantage(rewards, mask, [0, 0, 1, 1])
    # tokens: 0.5, 0.5, -0.5, 0, 0 -> mean 0.1, unbiased var 0.175 (no-signal rows are in the statistics)
    w = whiten_by_hand([0.5, 0.5, -0.5, 0.0, 0.0])
    assert row_values(adv, mask) == pytest.approx([w[0], w[2], 0.0, 0.0], abs=1e-6)
    assert torch.all(adv[2:] == 0)  # exactly 0 although whitening would shift them by -mean/std
    assert torch.equal(adv, ret)


# -- GAE ------------------------------------------------------------------------------------------


def test_gae_hand_computed():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = torch.ones(1, 3)
    adv, ret = compute_gae_advantage(rewards, mask, None, values=values, gamma=1.0, lam=0.5)
    # t=2: delta = 1 - 0.7 = 0.3; t=1: delta = 0.7 - 0.6 = 0.1, A = 0.1 + 0.5*0.3 = 0.25; t=0: 0.1 + 0.5*0.25 = 0.225
    raw = [0.225, 0.25, 0.3]
    assert_close(ret, [[0.725, 0.85, 1.0]], atol=1e-6)
    assert_close(adv, [whiten_by_hand(raw)], atol=1e-5)


def test_gae_discount_and_masked_positions_do_not_break_the_recursion():
    rewards = torch.tensor([[0.0, 5.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 99.0, 0.7, float("nan")], [1.0, 1.0, 3.0, 3.0]])
    mask = torch.tensor([[1, 0, 1, 0], [1, 1, 0, 0]])
    adv, ret = compute_gae_advantage(rewards, mask, None, values=values, gamma=0.9, lam=0.5)
    # row 0: t=2: 1 - 0.7 = 0.3; t=1 skipped (value 99, reward 5 ignored); t=0: 0.9*0.7 - 0.5 = 0.13, A = 0.13 +
    # 0.45*0.3 = 0.265
    # row 1: t=1: 2 - 1 = 1; t=0: 0.9*1 - 1 = -0.1, A = -0.1 + 0.45*1 = 0.35
    assert_close(ret, [[0.765, 0.0, 1.0, 0.0], [1.35, 2.0, 0.0, 0.0]], atol=1e-6)
    w = whiten_by_hand([0.265, 0.3, 0.35, 1.0])
    assert_close(adv, [[w[0], 0.0, w[1], 0.0], [w[2], w[3], 0.0, 0.0]], atol=1e-5)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()


def test_gae_without_values_says_what_is_missing():
    with pytest.raises(ValueError, match="critic's values"):
        compute_gae_advantage(torch.zeros(1, 2), torch.ones(1, 2), None)


# -- pass@k ---------------------------------------------------------------------------------------


def test_pass_at_k_binary_matches_the_papers_closed_form():
    # n = 5, two correct; k = 2: R = 1 - C(3,2)/C(5,2) = 0.7, s = sqrt(0.21)
    rewards, mask = outcome_batch([1, 0, 0, 1, 0], [1, 1, 2, 3, 1])
    adv, _ = compute_pass_at_k_advantage(rewards, mask, [0] * 5, k=2, epsilon=0.0)
    R, s = 0.7, math.sqrt(0.21)
    pos = (1 - R) / s
    neg = (1 - R - math.comb(2, 1) / math.comb(4, 1)) / s
    assert row_values(adv, mask) == pytest.approx([pos, neg, neg, pos, neg])


def brute_force_pass_at_k(values, k):
    subsets = list(itertools.combinations(range(len(values)), k))
    maxes = [max(values[i] for i in c) for c in subsets]
    mean = sum(maxes) / len(maxes)
    std = math.sqrt(sum((x - mean) ** 2 for x in maxes) / len(maxes))
    return [
        sum(x for c, x in zip(subsets, maxes) if i in c) / sum(1 for c in subsets if i in c) - mean
        for i in range(len(values))
    ], std


def test_pass_at_k_continuous_rewards_and_ties_match_enumerating_every_subset():
    values = [0.3, 1.0, -0.5, 0.3, 2.0, 0.0]
    rewards, mask = outcome_batch(values + [1.0, 0.0, 0.5], [1, 2, 3, 1, 2, 3, 1, 1, 2])
    index = [0] * 6 + [1, 1, 1]
    adv, _ = compute_pass_at_k_advantage(rewards, mask, index, k=3, epsilon=0.0)
    centred, std = brute_force_pass_at_k(values, 3)
    centred1, std1 = brute_force_pass_at_k([1.0, 0.0, 0.5], 3)  # k = n: one subset, no signal
    assert std1 == 0
    assert row_values(adv, mask) == pytest.approx([c / std for c in centred] + [0.0, 0.0, 0.0], abs=1e-6)
    adv_dr, _ = compute_pass_at_k_advantage(rewards, mask, index, k=3, norm_adv_by_std=False)
    assert row_values(adv_dr, mask)[:6] == pytest.approx(centred, abs=1e-6)


def test_pass_at_k_group_smaller_than_k_and_no_signal():
    # group 0 has 2 rows < k = 4: k becomes 2; group 1: 3 of 4 correct with k = 2 -> every pair has a correct one
    rewards, mask = outcome_batch([1, 0, 1, 1, 1, 0], [1] * 6)
    adv, _ = compute_pass_at_k_advantage(rewards, mask, [0, 0, 1, 1, 1, 1], k=4)
    assert torch.all(adv[2:] == 0)
    assert adv[0, 0] == 0 and adv[1, 0] == 0  # k = n = 2: the only subset holds both rows


def test_pass_at_k_k1_is_grpo_with_population_std():
    rewards, mask = outcome_batch([1, 0, 0, 1, 1], [1, 2, 3, 1, 1])
    adv, _ = compute_pass_at_k_advantage(rewards, mask, [0] * 5, k=1, epsilon=0.0)
    p = 0.6
    assert row_values(adv, mask) == pytest.approx(
        [(1 - p) / math.sqrt(p * (1 - p)) if r else -p / math.sqrt(p * (1 - p)) for r in [1, 0, 0, 1, 1]]
    )


def test_pass_at_k_requires_k():
    rewards, mask = outcome_batch([1, 0], [1, 1])
    with pytest.raises(ValueError, match="adv_kwargs.k"):
        compute_pass_at_k_advantage(rewards, mask, [0, 0])
    with pytest.raises(ValueError, match="integer >= 1"):
        compute_pass_at_k_advantage(rewards, mask, [0, 0], k=0)


# -- edge cases shared by every estimator ---------------------------------------------------------


ALL = [
    ("grpo", {}),
    ("dr_grpo", {}),
    ("rloo", {}),
    ("opo", {}),
    ("reinforce_plus_plus", {}),
    ("reinforce_plus_plus_baseline", {}),
    ("gae", {}),
    ("pass_at_k", {"k": 2}),
]


@pytest.mark.parametrize("name,extra", ALL)
def test_every_estimator_resolves_and_handles_empty_and_singleton_batches(pm, name, extra):
    est = pm.get("advantage_estimator", name)
    assert est.requires_critic == (name == "gae")
    available = {"values": torch.zeros(3, 4), "gamma": 1.0, "lam": 1.0, "epsilon": 1e-6, "norm_adv_by_std": True}
    # every row fully masked
    adv, ret = call_with_params(
        est.fn, torch.ones(3, 4), torch.zeros(3, 4), torch.tensor([0, 0, 1]), available=available, extra=extra
    )
    assert adv.shape == ret.shape == (3, 4)
    assert torch.all(adv == 0) and torch.all(ret == 0)
    # one row per group: group estimators give exactly 0; the batch-level ones whiten across rows
    rewards, mask = outcome_batch([1.0, -2.0, 3.0], [2, 4, 1])
    adv, ret = call_with_params(est.fn, rewards, mask, torch.tensor([0, 1, 2]), available=available, extra=extra)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert torch.all(adv[mask == 0] == 0) and torch.all(ret[mask == 0] == 0)
    if name not in ("reinforce_plus_plus", "gae"):
        assert torch.all(adv == 0)


def test_config_parameters_reach_the_estimators_by_name(pm):
    rewards, mask = outcome_batch([1.0, 0.0], [1, 1])
    index = [0, 0]
    # dr_grpo ignores the config's norm_adv_by_std=True because it does not declare it
    dr = call_with_params(
        pm.get("advantage_estimator", "dr_grpo").fn,
        rewards,
        mask,
        index,
        available={"norm_adv_by_std": True, "epsilon": 1e-6},
    )[0]
    assert dr[:, 0].tolist() == pytest.approx([0.5, -0.5])
    with pytest.raises(TypeError, match="unknown parameter 'kk'"):
        call_with_params(
            pm.get("advantage_estimator", "pass_at_k").fn,
            rewards,
            mask,
            index,
            available={},
            extra={"kk": 2},
            where="algorithm.adv_kwargs",
        )


def test_a_second_grpo_is_refused_naming_both_plugins(pm):
    class Impostor:
        @staticmethod
        def armor_register_advantage_estimators(register):
            register("grpo", compute_dr_grpo_advantage)

    fresh = PluginManager(disabled=pm.disabled)  # the shared one stays as it is
    fresh.register(Impostor(), name="impostor")
    with pytest.raises(DuplicatePluginError, match="'grpo'.*impostor"):
        fresh.get("advantage_estimator", "grpo")
