"""KL estimators, the straight-through variants, the KL loss and in-reward penalty, and the controllers."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from armor_core import KLEstimator
from armor_core.loop.kl_penalty import AdaptiveKLController, FixedKLController, apply_kl_penalty, build_kl_controller
from armor_core.ops.kl import KL_ESTIMATORS
from armor_core.plugins import PluginManager
from armor_core.workers.losses.kl_loss import compute_kl_loss
from armor_plugins.losses.aggregation import agg_token_mean

LN2 = math.log(2)

# log pi = 0, log pi_ref = ln 2: x = -ln 2. (value, d/d log pi) by hand:
#   k1 = x, grad 1;  k2 = x^2/2, grad x;  k3 = e^{-x} - 1 + x = 2 - 1 - ln 2, grad 1 - e^{-x} = -1;  abs = ln 2, grad
# sign(x) = -1
#   k1+ / k3+: the value of k1 / k3 with the gradient of k2
EXPECTED = {
    "k1": (-LN2, 1.0),
    "k2": (LN2**2 / 2, -LN2),
    "k3": (1 - LN2, -1.0),
    "abs": (LN2, -1.0),
    "k1+": (-LN2, -LN2),
    "k3+": (1 - LN2, -LN2),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_estimator_values_and_gradients_by_hand(pm, name):
    est = pm.get("kl_estimator", name)
    assert isinstance(est, KLEstimator)
    log_prob = torch.tensor([[0.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[LN2]], dtype=torch.float64)
    kl = est.fn(log_prob, ref)
    kl.sum().backward()
    value, grad = EXPECTED[name]
    assert float(kl.detach()) == pytest.approx(value)
    assert float(log_prob.grad) == pytest.approx(grad)


def test_k3_is_non_negative_and_finite_for_extreme_log_ratios():
    log_prob = torch.tensor([[-1000.0, 1000.0, 0.0, -50.0]], requires_grad=True)
    ref = torch.tensor([[1000.0, -1000.0, 0.0, 50.0]])
    for name, fn in KL_ESTIMATORS.items():
        log_prob.grad = None
        kl = fn(log_prob, ref)
        kl.sum().backward()
        assert torch.isfinite(kl).all() and torch.isfinite(log_prob.grad).all(), name
    assert torch.all(KL_ESTIMATORS["k3"](log_prob, ref) >= 0)


@given(st.floats(-30.0, 30.0, allow_nan=False))
def test_k3_is_bounded_and_exact_inside_the_bound(x):
    """At log-ratios up to +-30 k3 (and k3+'s value) stays in [0, 10] with finite gradients, and
    equals exp(-x) - 1 + x wherever that is below the bound."""
    from armor_core.ops.kl import KL_BOUND

    log_prob = torch.tensor([[x]], dtype=torch.float64, requires_grad=True)
    ref = torch.zeros(1, 1, dtype=torch.float64)
    exact = math.exp(-x) - 1 + x
    for name in ("k3", "k3+"):
        log_prob.grad = None
        kl = KL_ESTIMATORS[name](log_prob, ref)
        kl.sum().backward()
        value = float(kl.detach())
        assert 0.0 <= value <= KL_BOUND and math.isfinite(float(log_prob.grad)), (name, x)
        assert value == pytest.approx(min(exact, KL_BOUND), rel=1e-9, abs=1e-12), (name, x)
    if exact > KL_BOUND:  # past the bound a token adds no gradient through k3
        log_prob.grad = None
        KL_ESTIMATORS["k3"](log_prob, ref).sum().backward()
        assert float(log_prob.grad) == 0.0


def exact_expected_gradient(name, logits, ref_logits):
    """E_{y ~ pi}[grad_theta k(y)] summed exactly over the vocabulary, sampling weights held fixed.

    This is what a trainer's KL loss optimises in expectation: it differentiates k at samples from
    pi, not through the sampling distribution.
    """
    theta = logits.clone().requires_grad_(True)
    log_pi = torch.log_softmax(theta, -1)
    log_ref = torch.log_softmax(ref_logits, -1)
    weights = log_pi.exp().detach()
    k = KL_ESTIMATORS[name](log_pi.unsqueeze(0), log_ref.unsqueeze(0)).squeeze(0)
    (weights * k).sum().backward()
    return theta.grad


def test_straight_through_variants_follow_the_true_kl_gradient_end_to_end():
    torch.manual_seed(0)
    logits = torch.randn(6, dtype=torch.float64)
    ref_logits = torch.randn(6, dtype=torch.float64)
    theta = logits.clone().requires_grad_(True)
    p, log_p, log_q = torch.softmax(theta, -1), torch.log_softmax(theta, -1), torch.log_softmax(ref_logits, -1)
    (p * (log_p - log_q)).sum().backward()  # analytic KL(pi || ref)
    true_grad = theta.grad
    for name in ("k2", "k1+", "k3+"):
        torch.testing.assert_close(exact_expected_gradient(name, logits, ref_logits), true_grad)
    # the plain estimators do not: k1's expected gradient is 0, k3's is that of KL(ref || pi)
    torch.testing.assert_close(exact_expected_gradient("k1", logits, ref_logits), torch.zeros(6, dtype=torch.float64))
    assert not torch.allclose(exact_expected_gradient("k3", logits, ref_logits), true_grad, atol=1e-3)


def test_kl_loss_through_registry_and_aggregation(pm):
    log_prob = torch.tensor([[0.0, -1.0, float("nan")]], requires_grad=True)
    ref = torch.tensor([[LN2, -1.0, 3.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss_mat, metrics = compute_kl_loss(log_prob, ref, mask, kl_coef=0.5, estimator=pm.get("kl_estimator", "k3+"))
    loss = agg_token_mean(loss_mat, mask)
    loss.backward()
    # value: 0.5 * mean(k3) = 0.5 * (1 - ln 2 + 0) / 2; gradient: 0.5 * k2' / 2 tokens
    assert float(loss.detach()) == pytest.approx(0.5 * (1 - LN2) / 2, rel=1e-6)
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.5 * -LN2 / 2, 0.0, 0.0]]))
    assert float(metrics["kl_loss"]) == pytest.approx((1 - LN2) / 2, rel=1e-6)


def test_apply_kl_penalty_folds_the_kl_into_the_reward():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    log_prob = torch.tensor([[0.0, 0.0, 0.0], [0.0, -1.0, 5.0]])
    ref = torch.tensor([[LN2, 0.0, 0.0], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    rewards, metrics = apply_kl_penalty(scores, log_prob, ref, mask, kl_coef=0.1, estimator="k1")
    # k1 per token: row 0: -ln2, 0, 0; row 1: 1, 0, (masked)
    torch.testing.assert_close(rewards, torch.tensor([[0.1 * LN2, 0.0, 1.0], [-0.1, 2.0, 0.0]]))
    assert metrics["reward_kl"] == pytest.approx(((-LN2 / 3) + (1 / 2)) / 2, rel=1e-6)
    assert metrics["reward_kl_coef"] == 0.1


def test_apply_kl_penalty_unknown_name_lists_choices():
    with pytest.raises(Exception, match="k3"):
        apply_kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), 0.1, estimator=42)


def test_a_third_party_kl_estimator_is_accepted_by_the_penalty():
    class Halved:
        @staticmethod
        def armor_register_kl_estimators(register):
            register("half_k1", lambda log_prob, ref_log_prob: 0.5 * (log_prob - ref_log_prob))

    pm = PluginManager(load_entrypoints=False)
    pm.register(Halved(), name="halved")
    est = pm.get("kl_estimator", "half_k1")
    rewards, _ = apply_kl_penalty(
        torch.zeros(1, 1), torch.ones(1, 1), torch.zeros(1, 1), torch.ones(1, 1), 1.0, estimator=est
    )
    assert float(rewards) == pytest.approx(-0.5)


def test_fixed_controller():
    ctrl = build_kl_controller("fixed", 0.05)
    assert isinstance(ctrl, FixedKLController)
    ctrl.update(10.0, 100)
    assert ctrl.value == 0.05


def test_adaptive_controller_follows_ziegler_et_al():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target=0.1, horizon=100)
    ctrl.update(current_kl=0.15, n_steps=10)  # error 0.5, clipped to 0.2: x (1 + 0.2 * 10/100)
    assert ctrl.value == pytest.approx(0.102)
    ctrl.update(current_kl=0.11, n_steps=10)  # error 0.1: x 1.01
    assert ctrl.value == pytest.approx(0.102 * 1.01)
    ctrl.update(current_kl=0.0, n_steps=10)  # error -1, clipped to -0.2: x 0.98
    assert ctrl.value == pytest.approx(0.102 * 1.01 * 0.98)
    before = ctrl.value
    ctrl.update(float("nan"), 10)
    assert ctrl.value == before
    restored = build_kl_controller("adaptive", 1.0, 0.1, 100)
    restored.load_state_dict(ctrl.state_dict())
    assert restored.value == ctrl.value


def test_controller_arguments_are_checked():
    with pytest.raises(ValueError, match="kl_target"):
        AdaptiveKLController(0.1, 0.0, 10)
    with pytest.raises(ValueError, match="must be one of 'fixed', 'adaptive'"):
        build_kl_controller("pid", 0.1)
