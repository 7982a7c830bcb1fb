"""The ``abs+`` KL estimator (value of ``abs``, gradient of ``k2``): by hand, parity with verl's ``kl_penalty``
``+`` rule (verl is not installed here: its values are hand-computed from that definition), and registration."""

from __future__ import annotations

import math

import pytest
import torch

from armor_core import get_plugin
from armor_core.ops.kl import kl_abs_plus
from armor_core.testing import check_kl_estimator

LN2 = math.log(2)


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
