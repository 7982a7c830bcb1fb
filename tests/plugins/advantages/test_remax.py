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
