"""Round 2 of the estimators verl has: the ``abs+`` KL estimator, ``token-sum`` aggregation, ``grpo_passk``.

verl is not installed here, so the "verl" cases below are hand-computed from the definitions of
verl's ``kl_penalty`` (``+`` rule), ``agg_loss`` and ``compute_grpo_passk_outcome_advantage``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from armor_core import AdvantageEstimator, get_plugin
from armor_core.ops.kl import kl_abs_plus
from armor_core.testing import check_advantage_estimator, check_kl_estimator, check_loss_aggregation
from armor_plugins.advantages.grpo_passk import compute_grpo_passk_advantage
from armor_plugins.losses.aggregation import agg_token_sum

LN2 = math.log(2)

# -- abs+ ---------------------------------------------------------------------------------------


def test_abs_plus_has_the_value_of_abs_and_the_gradient_of_k2():
    # log pi = 0, log pi_ref = ln 2: x = -ln 2; value |x| = ln 2, gradient d(x^2/2)/d log pi = x
    log_prob = torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True)
    kl = kl_abs_plus(log_prob, torch.tensor([[LN2]], dtype=torch.float64))
    kl.sum().backward()
    assert kl.item() == pytest.approx(LN2)
    assert log_prob.grad.item() == pytest.approx(-LN2)


def test_abs_plus_matches_verl_on_generated_log_ratios():
    # x = log pi - log pi_ref; verl's abs+: value |x|, gradient x (hand-computed from its definition)
    x = torch.tensor([[0.5, -1.2, 3.0, 0.0, -25.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -0.1]], dtype=torch.float64)
    log_prob = (ref + x).requires_grad_(True)
    kl = kl_abs_plus(log_prob, ref)
    kl.sum().backward()
    torch.testing.assert_close(kl.detach(), torch.tensor([[0.5, 1.2, 3.0, 0.0, 25.0]], dtype=torch.float64))
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.5, -1.2, 3.0, 0.0, -25.0]], dtype=torch.float64))


def test_abs_plus_is_registered_and_passes_the_contract_check():
    est = get_plugin("kl_estimator", "abs+")
    assert est.fn is kl_abs_plus
    check_kl_estimator(est)


# -- token-sum ----------------------------------------------------------------------------------


def test_token_sum_by_hand_ignores_masked_positions_and_global_counts():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, float("nan")], [5.0, 5.0, 5.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    out = agg_token_sum(loss, mask, global_num_tokens=100, global_num_seqs=7, norm_constant=3.0)
    assert out.item() == pytest.approx(10.0)
    out.backward()
    torch.testing.assert_close(loss.grad, mask.float())  # weight 1 per valid token, 0 elsewhere


def test_token_sum_of_micro_batches_is_the_sum_of_the_batch():
    g = torch.Generator().manual_seed(3)
    loss = torch.randn(6, 5, generator=g, dtype=torch.float64)
    mask = (torch.rand(6, 5, generator=g) > 0.4).long()
    whole = agg_token_sum(loss, mask)
    parts = agg_token_sum(loss[:2], mask[:2]) + agg_token_sum(loss[2:], mask[2:])
    torch.testing.assert_close(parts, whole)
    assert agg_token_sum(torch.ones(2, 3), torch.zeros(2, 3)).item() == 0.0


def test_token_sum_is_registered_and_passes_the_contract_check():
    agg = get_plugin("loss_aggregation", "token-sum")
    assert agg.fn is agg_token_sum
    check_loss_aggregation(agg)


# -- grpo_passk ---------------------------------------------------------------------------------


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
