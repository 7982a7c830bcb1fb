"""Property tests: every estimator, loss, KL estimator and aggregation stays finite on extreme but finite inputs.

Rewards and values up to +-1e6, log-ratios up to +-1000, any mask including all-zero ones; the
outputs, and the gradients of the losses, must be finite and zero outside the mask.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from armor_core.loop.kl_penalty import apply_kl_penalty
from armor_core.ops.kl import KL_ESTIMATORS
from armor_core.workers.losses.kl_loss import compute_kl_loss
from armor_plugins.advantages.gae import compute_gae_advantage
from armor_plugins.advantages.grpo import compute_dr_grpo_advantage, compute_grpo_advantage
from armor_plugins.advantages.opo import compute_opo_advantage
from armor_plugins.advantages.pass_at_k import compute_pass_at_k_advantage
from armor_plugins.advantages.reinforce_plus_plus import (
    compute_reinforce_plus_plus_advantage,
    compute_reinforce_plus_plus_baseline_advantage,
)
from armor_plugins.advantages.rloo import compute_rloo_advantage
from armor_plugins.losses.aggregation import AGGREGATIONS
from armor_plugins.losses.cispo import compute_policy_loss_cispo
from armor_plugins.losses.gspo import compute_policy_loss_gspo
from armor_plugins.losses.ppo_clip import compute_policy_loss_ppo_clip

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True)
EXTREMES = [0.0, 1.0, -1.0, 1e6, -1e6, 1e-30, -1e-30, 0.5]


def big_floats(limit):
    return st.one_of(
        st.sampled_from([x for x in EXTREMES if abs(x) <= limit] + [limit, -limit]),
        st.floats(-limit, limit, allow_nan=False, allow_infinity=False, width=32),
    )


@st.composite
def batches(draw, limit=1e6):
    bs = draw(st.integers(1, 6))
    T = draw(st.integers(1, 5))

    def matrix(elements):
        return torch.tensor([[draw(elements) for _ in range(T)] for _ in range(bs)], dtype=torch.float32)

    rewards = matrix(big_floats(limit))
    mask = matrix(st.sampled_from([0.0, 1.0]))
    if draw(st.booleans()):
        mask = torch.zeros_like(mask) if draw(st.booleans()) else torch.ones_like(mask)
    index = torch.tensor([draw(st.integers(0, 2)) for _ in range(bs)])
    values = matrix(big_floats(limit))
    return rewards, mask, index, values


def assert_finite_and_masked(t, mask, what):
    assert torch.isfinite(t).all(), f"{what}: {t}"
    assert torch.all(t[mask == 0] == 0), f"{what} is not zero outside the mask: {t}"


@pytest.mark.parametrize(
    "name,fn,kwargs",
    [
        ("grpo", compute_grpo_advantage, {}),
        ("dr_grpo", compute_dr_grpo_advantage, {}),
        ("rloo", compute_rloo_advantage, {}),
        ("opo", compute_opo_advantage, {}),
        ("reinforce_plus_plus", compute_reinforce_plus_plus_advantage, {"gamma": 0.99}),
        ("reinforce_plus_plus_baseline", compute_reinforce_plus_plus_baseline_advantage, {}),
        ("gae", compute_gae_advantage, {"gamma": 0.99, "lam": 0.95}),
        ("pass_at_k", compute_pass_at_k_advantage, {"k": 2}),
    ],
)
def test_advantages_are_finite(name, fn, kwargs):
    @SETTINGS
    @given(batches())
    def check(batch):
        rewards, mask, index, values = batch
        kw = dict(kwargs, values=values) if name == "gae" else kwargs
        adv, ret = fn(rewards, mask, index, **kw)
        assert adv.shape == ret.shape == rewards.shape
        assert_finite_and_masked(adv, mask, f"{name} advantages")
        assert_finite_and_masked(ret, mask, f"{name} returns")

    check()


LOSSES = {
    "ppo_clip": compute_policy_loss_ppo_clip,
    "gspo": compute_policy_loss_gspo,
    "cispo": compute_policy_loss_cispo,
}


@st.composite
def loss_batches(draw):
    """log-probs and old log-probs up to +-1000 (log-ratios up to +-2000), advantages up to +-1e6."""
    log_prob, mask, _, old = draw(batches(limit=1e3))
    adv = torch.tensor(
        [[draw(big_floats(1e6)) for _ in range(log_prob.shape[1])] for _ in range(log_prob.shape[0])],
        dtype=torch.float32,
    )
    return log_prob, old, adv, mask


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_policy_losses_and_their_gradients_are_finite(name):
    @SETTINGS
    @given(loss_batches())
    def check(batch):
        log_prob, old, adv, mask = batch
        log_prob = log_prob.clone().requires_grad_(True)
        loss, metrics = LOSSES[name](log_prob, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28)
        assert_finite_and_masked(loss, mask, f"{name} loss")
        for mode, agg in AGGREGATIONS.items():
            log_prob.grad = None
            agg(loss, mask, global_num_tokens=None, global_num_seqs=None, norm_constant=8.0).backward(retain_graph=True)
            assert_finite_and_masked(log_prob.grad, mask, f"{name} gradient under {mode}")
        assert all(torch.isfinite(torch.as_tensor(v)).all() for v in metrics.values()), metrics

    check()


@SETTINGS
@given(batches(limit=1e3))
def test_kl_estimators_loss_and_penalty_are_finite(batch):
    log_prob, mask, _, ref = batch
    for name in KL_ESTIMATORS:
        lp = log_prob.clone().requires_grad_(True)
        loss_mat, metrics = compute_kl_loss(lp, ref, mask, kl_coef=0.1, estimator=name)
        loss_mat.sum().backward()
        assert_finite_and_masked(loss_mat, mask, f"{name} kl loss")
        assert_finite_and_masked(lp.grad, mask, f"{name} kl gradient")
        rewards, pen = apply_kl_penalty(log_prob, log_prob, ref, mask, 0.1, name)
        assert_finite_and_masked(rewards, mask, f"{name} penalised rewards")
        assert torch.isfinite(torch.tensor(pen["reward_kl"]))
