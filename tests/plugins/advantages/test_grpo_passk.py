"""The ``grpo_passk`` advantage estimator: hand-computed cases, parity with verl's
``compute_grpo_passk_outcome_advantage`` (verl is not installed here: its values are hand-computed from that
definition), and registration."""

from __future__ import annotations

import numpy as np
import torch

from armor_core import AdvantageEstimator, get_plugin
from armor_core.testing import check_advantage_estimator
from armor_plugins.advantages.grpo_passk import compute_grpo_passk_advantage


def _rows(scores, masked=()):
    """(bs, 3) token rewards with the score on the last valid token; rows in ``masked`` have no valid token."""
    bs = len(scores)
    mask = torch.ones(bs, 3)
    for i in masked:
        mask[i] = 0
    rewards = torch.zeros(bs, 3)
    rewards[:, 2] = torch.tensor(scores)
    return rewards, mask


def test_grpo_passk_by_hand():
    # group a: [1, 0, 0.5] (+ a fully masked row scored 5, not a member); group b: tie at the top; c: singleton
    rewards, mask = _rows([1.0, 0.0, 0.5, 5.0, 1.0, 1.0, 0.0, 3.0], masked=(3,))
    index = np.array(["a", "a", "a", "a", "b", "b", "b", "c"], dtype=object)
    adv, ret = compute_grpo_passk_advantage(rewards, mask, index)
    # a: margin 1 - 0.5 = 0.5, sample std of [1, 0, .5] = 0.5 -> 0.5 / (0.5 + 1e-6) on row 0 only
    expected = torch.tensor([0.5 / (0.5 + 1e-6), 0, 0, 0, 0, 0, 0, 0])
    torch.testing.assert_close(adv[:, 0], expected)
    assert (adv[3] == 0).all() and torch.equal(adv, ret)
    assert (adv == adv[:, :1]).all()  # broadcast over the response
    raw, _ = compute_grpo_passk_advantage(rewards, mask, index, norm_adv_by_std=False)
    torch.testing.assert_close(raw[:, 0], torch.tensor([0.5, 0, 0, 0, 0, 0, 0, 0]))


def test_grpo_passk_matches_verl_on_generated_groups():
    # two groups of four, tensor index; verl's values (hand-computed from its definition):
    # g0 [0.2, 0.9, 0.4, 0.7]: margin 0.2, sample std 0.3109126 -> 0.2 / (std + 1e-6) = 0.6432655 on row 1
    # g1 [0.0, -1.0, 2.0, 0.5]: margin 1.5, sample std 1.25 -> 1.5 / (std + 1e-6) = 1.1999990 on row 6
    rewards, mask = _rows([0.2, 0.9, 0.4, 0.7, 0.0, -1.0, 2.0, 0.5])
    index = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv, _ = compute_grpo_passk_advantage(rewards, mask, index)
    expected = torch.tensor([0, 0.6432655, 0, 0, 0, 0, 1.1999990, 0])
    torch.testing.assert_close(adv[:, 0], expected, rtol=1e-6, atol=1e-6)


def test_grpo_passk_is_registered_and_passes_the_contract_check():
    est = get_plugin("advantage_estimator", "grpo_passk")
    assert isinstance(est, AdvantageEstimator) and est.grouped and not est.requires_critic
    adv, ret = check_advantage_estimator(est)
    assert torch.equal(adv, ret)
