"""ReMax: hand-computed advantages (outcome and per-token rewards, inner masked positions, a fully
masked row), the missing baseline, and its registration with ``greedy_baseline``."""

from __future__ import annotations

import pytest
import torch

from armor_core.interfaces import AdvantageEstimator
from armor_core.plugins import get_plugin
from armor_core.testing import check_advantage_estimator
from armor_plugins.advantages.remax import compute_remax_advantage


def test_outcome_reward_minus_the_greedy_score_at_every_valid_token():
    # row 0: 3 tokens, score 1 on the last; row 1: 2 tokens, score 0; row 2: fully masked
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    baseline = torch.tensor([0.25, 0.25, 0.5])  # rows 0 and 1 share a prompt
    adv, ret = compute_remax_advantage(rewards, mask, torch.tensor([0, 0, 1]), baseline)
    torch.testing.assert_close(adv, torch.tensor([[0.75, 0.75, 0.75, 0], [-0.25, -0.25, 0, 0], [0, 0, 0, 0]]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]))


def test_token_rewards_give_the_reward_to_go_and_masked_positions_are_skipped():
    # per-token rewards (a KL penalty folded in): returns are the undiscounted sums from t to the end;
    # position 2 is an observation inside the response (mask 0): its reward is ignored, its outputs are 0
    rewards = torch.tensor([[-0.1, -0.2, 5.0, -0.3, 1.0]])
    mask = torch.tensor([[1.0, 1, 0, 1, 1]])
    adv, ret = compute_remax_advantage(rewards, mask, torch.tensor([0]), torch.tensor([0.4]))
    torch.testing.assert_close(ret, torch.tensor([[0.4, 0.5, 0.0, 0.7, 1.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.0, 0.1, 0.0, 0.3, 0.6]]))


def test_a_sample_that_matches_the_greedy_answer_gets_no_signal_and_equal_groups_still_learn():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 1.0]])
    mask = torch.ones(2, 2)
    same, _ = compute_remax_advantage(rewards, mask, torch.tensor([0, 0]), torch.tensor([1.0, 1.0]))
    assert torch.equal(same, torch.zeros(2, 2))
    # GRPO would give this group 0 (its samples agree); ReMax pushes both up: greedy decoding was wrong
    better, _ = compute_remax_advantage(rewards, mask, torch.tensor([0, 0]), torch.tensor([0.0, 0.0]))
    assert torch.equal(better, torch.ones(2, 2))


def test_without_a_baseline_it_says_what_is_missing():
    with pytest.raises(ValueError, match="baseline_scores"):
        compute_remax_advantage(torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([0]))


def test_registered_with_a_greedy_baseline_and_passes_the_contract_check():
    est = get_plugin("advantage_estimator", "remax")
    assert isinstance(est, AdvantageEstimator) and est.greedy_baseline and not est.grouped
    adv, ret = check_advantage_estimator(est)  # the check offers a baseline as the step does
    assert not torch.equal(adv, ret)


# Produced once by running verl 0.9.1's compute_remax_outcome_advantage (verl/trainer/ppo/core_algos.py, from the
# PyPI wheel) on these inputs in a scratch script (2026-12-04); only the numbers are kept. Row 2 has a masked
# position inside the response: verl leaves the reward-to-go there, ARMOR 0, so only valid positions are compared.
REMAX_MASK = [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 1, 1, 0]]
REMAX_VERL_0_9_1 = [
    (  # token-level rewards, baseline (the greedy response's score), verl's advantages, verl's returns
        [[-0.0734, 0.3931, 0.4734, -0.5572, 0.8454], [-0.4474, -0.1778, 0.6162, 0.0691, -0.8411],
         [0.1588, 0.0664, 0.0687, 0.1203, 0.6977]],
        [0.0132, 0.9499, 0.1099],
        [[1.0681, 1.1415, 0.7484, 0.275, 0.8322], [-0.9589, -0.5115, -0.3337, 0.0, 0.0], [0.2379, 0.189, 0.0791, 0.0104, 0.0]],
        [[1.0813, 1.1547, 0.7616, 0.2882, 0.8454], [-0.009, 0.4384, 0.6162, 0.0, 0.0], [0.3478, 0.189, 0.189, 0.1203, 0.0]],
    ),
    (
        [[0.6735, 1.1348, -0.0455, 0.4866, -0.5505], [-0.3742, 0.9932, -0.1451, -1.211, 0.1458],
         [-0.2316, 0.5938, -0.161, 0.6101, 0.3794]],
        [0.7176, 0.3435, 0.056],
        [[0.9813, 0.3078, -0.827, -0.7815, -1.2681], [0.1304, 0.5046, -0.4886, 0.0, 0.0], [0.1615, 0.4491, 0.3931, 0.5541, 0.0]],
        [[1.6989, 1.0254, -0.1094, -0.0639, -0.5505], [0.4739, 0.8481, -0.1451, 0.0, 0.0], [0.2175, 0.4491, 0.4491, 0.6101, 0.0]],
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", [0, 1])
def test_matches_verl_0_9_1_on_valid_positions(case):
    rewards, baseline, verl_adv, verl_ret = (torch.tensor(x, dtype=torch.float64) for x in REMAX_VERL_0_9_1[case])
    mask = torch.tensor(REMAX_MASK, dtype=torch.float64)
    adv, ret = compute_remax_advantage(rewards, mask, torch.tensor([0, 1, 2]), baseline)
    valid = mask.bool()
    torch.testing.assert_close(adv[valid], verl_adv[valid], rtol=0, atol=1e-9)
    torch.testing.assert_close(ret[valid], verl_ret[valid], rtol=0, atol=1e-9)
    assert torch.equal(adv[~valid], torch.zeros_like(adv[~valid]))  # ARMOR's departure: 0 where the mask is 0
