"""DRO policy loss: hand-computed values and gradients, the plain policy gradient at the sampling
policy, the penalty pulling back a policy that moved, masking, the weight's check, registration."""

from __future__ import annotations

import math

import pytest
import torch

from armor_core import get_plugin
from armor_core.testing import check_policy_loss
from armor_plugins.losses.dro import compute_policy_loss_dro
from armor_plugins.losses.gpg import compute_policy_loss_gpg

F64 = torch.float64


def test_value_and_gradient_by_hand():
    # token 0 moved: d = log .5 - log .25 = log 2; token 1 did not (d = 0); token 2 is padding (NaN there)
    log_prob = torch.tensor([[math.log(0.5), math.log(0.25), float("nan")]], dtype=F64, requires_grad=True)
    old = torch.tensor([[math.log(0.25), math.log(0.25), 0.0]], dtype=F64)
    adv = torch.tensor([[1.0, -2.0, 5.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = compute_policy_loss_dro(log_prob, old, adv, mask, beta=0.1)
    d = math.log(2)
    expected = [-(1.0 * math.log(0.5) - 0.05 * d * d), -(-2.0 * math.log(0.25)), 0.0]
    torch.testing.assert_close(loss, torch.tensor([expected], dtype=F64))
    loss.sum().backward()
    # d loss / d log pi = -(A - beta * d): the penalty takes 0.1 log 2 off the moved token's push
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-(1.0 - 0.1 * d), 2.0, 0.0]], dtype=F64))
    assert metrics["pg_clipfrac"] == 0


def test_at_the_sampling_policy_the_gradient_is_the_plain_policy_gradient():
    g = torch.Generator().manual_seed(0)
    actions = torch.randint(0, 5, (4, 3), generator=g)
    adv = torch.randn(4, 3, generator=g, dtype=F64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    grads = []
    for fn, kwargs in ((compute_policy_loss_dro, {"beta": 3.0}), (compute_policy_loss_gpg, {})):
        logits = torch.randn(3, 5, generator=torch.Generator().manual_seed(1), dtype=F64, requires_grad=True)
        log_prob = torch.log_softmax(logits, -1)[torch.arange(3), actions]
        loss, _ = fn(log_prob, log_prob.detach(), adv, mask, **kwargs)
        loss.sum().backward()
        grads.append(logits.grad)
    assert grads[1].abs().sum() > 0
    torch.testing.assert_close(grads[0], grads[1])


def test_a_larger_weight_pulls_a_moved_policy_back_harder():
    old = torch.zeros(1, 1, dtype=F64)
    adv = torch.ones(1, 1, dtype=F64)

    def grad(beta):
        log_prob = torch.tensor([[0.5]], dtype=F64, requires_grad=True)  # moved up by 0.5 with a positive advantage
        compute_policy_loss_dro(log_prob, old, adv, torch.ones(1, 1), beta=beta)[0].sum().backward()
        return log_prob.grad.item()

    assert grad(0.1) == pytest.approx(-(1 - 0.05)) and grad(4.0) == pytest.approx(-(1 - 2.0))  # 4.0: pushed back down


@pytest.mark.parametrize("beta", [0.0, -0.1])
def test_a_weight_that_is_not_positive_is_refused(beta):
    with pytest.raises(ValueError, match="beta"):
        compute_policy_loss_dro(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), beta=beta)


def test_registered_and_passes_the_contract_check():
    loss = get_plugin("policy_loss", "dro")
    assert loss.fn is compute_policy_loss_dro
    check_policy_loss(loss, beta=0.5)
