"""Policy losses (PPO clip, GSPO, CISPO): hand-computed values, gradients and metrics."""

from __future__ import annotations

import math

import pytest
import torch

from armor_core.interfaces import call_with_params
from armor_plugins.losses.aggregation import agg_seq_mean_token_mean, agg_token_mean
from armor_plugins.losses.cispo import compute_policy_loss_cispo
from armor_plugins.losses.gspo import compute_policy_loss_gspo
from armor_plugins.losses.ppo_clip import compute_policy_loss_ppo_clip


def log(x):
    return math.log(x)


def leaf(values):
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


# -- PPO clip -------------------------------------------------------------------------------------

# (advantage, ratio) per token, with eps_low=0.2, eps_high=0.28, c=3:
PPO_CASES = [
    (1.0, 1.5),  # upper clip binds: -1 * 1.28, no gradient
    (1.0, 0.5),  # positive advantage, low ratio: unclipped -0.5
    (-1.0, 0.5),  # lower clip binds: 0.8, no gradient
    (-1.0, 1.2),  # inside the range: 1.2
    (-1.0, 5.0),  # dual-clip binds: min(5, 3) = 3, no gradient
    (-2.0, 2.0),  # above the range but below c: 4 (unbounded PPO side, gradient flows)
]


def ppo_batch():
    adv = torch.tensor([[a for a, _ in PPO_CASES] + [5.0]], dtype=torch.float64)
    old = torch.full((1, len(PPO_CASES) + 1), -1.0, dtype=torch.float64)
    log_prob = leaf([[-1.0 + log(r) for _, r in PPO_CASES] + [float("nan")]])  # the padded token is NaN
    mask = torch.tensor([[1] * len(PPO_CASES) + [0]])
    return log_prob, old, adv, mask


def test_ppo_clip_hand_computed_values_gradients_and_metrics():
    log_prob, old, adv, mask = ppo_batch()
    loss, metrics = compute_policy_loss_ppo_clip(
        log_prob, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0
    )
    torch.testing.assert_close(loss, torch.tensor([[-1.28, -0.5, 0.8, 1.2, 3.0, 4.0, 0.0]], dtype=torch.float64))
    loss.sum().backward()
    # d(-A r)/d log pi = -A r where unclipped, 0 where a clip binds; 0 (not NaN) for the padded token
    torch.testing.assert_close(log_prob.grad, torch.tensor([[0.0, -0.5, 0.0, 1.2, 0.0, 4.0, 0.0]], dtype=torch.float64))
    assert float(metrics["pg_clipfrac"]) == pytest.approx(1 / 6)
    assert float(metrics["pg_clipfrac_lower"]) == pytest.approx(1 / 6)
    assert float(metrics["pg_clipfrac_dual"]) == pytest.approx(1 / 6)
    ratios = [r for _, r in PPO_CASES]
    assert float(metrics["ratio_min"]) == pytest.approx(0.5)
    assert float(metrics["ratio_max"]) == pytest.approx(5.0)
    assert float(metrics["ratio_mean"]) == pytest.approx(sum(ratios) / 6)
    assert float(metrics["ppo_kl"]) == pytest.approx(-sum(log(r) for r in ratios) / 6)
    assert float(metrics["ppo_kl_k3"]) == pytest.approx(sum(r - 1 - log(r) for r in ratios) / 6)
    assert all(not (isinstance(v, torch.Tensor) and v.requires_grad) for v in metrics.values())


def test_ppo_clip_symmetric_and_without_dual_clip():
    log_prob, old, adv, mask = ppo_batch()
    loss, metrics = compute_policy_loss_ppo_clip(
        log_prob, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=None
    )
    # upper bound 1.2 now; token 5 (A=-1, r=5) keeps its unbounded 5
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -0.5, 0.8, 1.2, 5.0, 4.0, 0.0]], dtype=torch.float64))
    assert float(metrics["pg_clipfrac_dual"]) == 0.0


def test_ppo_clip_rejects_a_dual_clip_bound_at_or_below_one():
    log_prob, old, adv, mask = ppo_batch()
    with pytest.raises(ValueError, match="clip_ratio_c=1.0 must be > 1"):
        compute_policy_loss_ppo_clip(log_prob, old, adv, mask, clip_ratio_c=1.0)


def test_log_ratio_is_clamped_so_extreme_inputs_stay_finite():
    for loss_fn in (compute_policy_loss_ppo_clip, compute_policy_loss_gspo, compute_policy_loss_cispo):
        log_prob = torch.tensor([[1000.0, -1000.0, 0.0]], requires_grad=True)
        old = torch.tensor([[-1000.0, 1000.0, 0.0]])
        adv = torch.tensor([[-1e6, 1e6, 1.0]])
        loss, metrics = loss_fn(log_prob, old, adv, torch.ones(1, 3))
        loss.sum().backward()
        assert torch.isfinite(loss).all() and torch.isfinite(log_prob.grad).all(), loss_fn.__name__
        assert all(math.isfinite(float(v)) for v in metrics.values()), loss_fn.__name__
    # the clamp is at +-20: the ratio metric shows exp(20), not inf
    _, metrics = compute_policy_loss_ppo_clip(
        torch.tensor([[1000.0]]), torch.tensor([[0.0]]), torch.tensor([[1.0]]), torch.ones(1, 1)
    )
    assert float(metrics["ratio_max"]) == pytest.approx(math.exp(20), rel=1e-5)


def test_no_valid_token_gives_zero_loss_and_neutral_metrics():
    for loss_fn in (compute_policy_loss_ppo_clip, compute_policy_loss_gspo, compute_policy_loss_cispo):
        log_prob = torch.full((2, 3), float("nan"), requires_grad=True)
        loss, metrics = loss_fn(log_prob, torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3))
        agg_token_mean(loss, torch.zeros(2, 3)).backward()
        assert torch.all(loss == 0) and torch.all(log_prob.grad == 0), loss_fn.__name__
        assert (
            float(metrics["ratio_mean"]) == 1.0
            and float(metrics["pg_clipfrac"]) == 0.0
            and float(metrics["ppo_kl"]) == 0.0
        )


# -- GSPO -----------------------------------------------------------------------------------------


def test_gspo_token_form_equals_the_sequence_objective_under_seq_mean_token_mean():
    # seq 0: token log-ratios ln 2, 0 -> s = sqrt(2) inside [1 - 0.5, 1 + 0.5]; A = +1
    # seq 1: three tokens with log-ratios ln 3 each -> s = 3 > 1.5 and A = +1: clipped, no gradient
    # seq 2: one token, log-ratio ln 0.9, A = -2 -> s = 0.9, inside
    old = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0], [-0.5, 0.0, 0.0]], dtype=torch.float64)
    log_prob = leaf([[-1.0 + log(2), -2.0, 0.0], [-1.0 + log(3)] * 3, [-0.5 + log(0.9), 0.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [-2.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    loss_mat, metrics = compute_policy_loss_gspo(log_prob, old, adv, mask, clip_ratio_low=0.5, clip_ratio_high=0.5)
    s0 = math.sqrt(2)
    torch.testing.assert_close(loss_mat, torch.tensor([[-s0, -s0, 0], [-1.5] * 3, [1.8, 0, 0]], dtype=torch.float64))
    loss = agg_seq_mean_token_mean(loss_mat, mask)
    loss.backward()

    # GSPO's sequence-level objective written directly: -mean_i min(s_i A_i, clip(s_i) A_i)
    lp2 = log_prob.detach().clone().requires_grad_(True)
    s = torch.stack([torch.exp(((lp2[i] - old[i]) * mask[i]).sum() / mask[i].sum()) for i in range(3)])
    a = torch.tensor([1.0, 1.0, -2.0], dtype=torch.float64)
    seq_obj = -torch.minimum(s * a, s.clamp(0.5, 1.5) * a).mean()
    seq_obj.backward()
    torch.testing.assert_close(loss, seq_obj.detach())
    torch.testing.assert_close(log_prob.grad, lp2.grad * mask)
    # by hand: seq 0 tokens get -s0/2 / 3 each, seq 1 nothing, seq 2: -A s = 1.8, / 3 sequences
    torch.testing.assert_close(
        log_prob.grad, torch.tensor([[-s0 / 6, -s0 / 6, 0], [0, 0, 0], [0.6, 0, 0]], dtype=torch.float64)
    )
    assert float(metrics["pg_clipfrac"]) == pytest.approx(3 / 6)  # the 3 tokens of seq 1
    assert float(metrics["ratio_max"]) == pytest.approx(3.0)
    assert float(metrics["ratio_min"]) == pytest.approx(0.9)
    assert float(metrics["seq_ratio_mean"]) == pytest.approx((s0 + 3 + 0.9) / 3)


def test_gspo_under_token_mean_weights_sequences_by_length():
    old = torch.zeros(2, 2, dtype=torch.float64)
    log_prob = leaf([[0.0, 0.0], [0.0, 0.0]])
    adv = torch.ones(2, 2, dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss_mat, _ = compute_policy_loss_gspo(log_prob, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    agg_token_mean(loss_mat, mask).backward()
    # s = 1 everywhere, each token's gradient is -1 / (3 tokens)
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-1 / 3, -1 / 3], [-1 / 3, 0]], dtype=torch.float64))


# -- CISPO ----------------------------------------------------------------------------------------


def test_cispo_clips_the_weight_but_keeps_every_tokens_gradient():
    old = torch.zeros(1, 4, dtype=torch.float64)
    log_prob = leaf([[log(1.5), log(0.5), log(1.1), 0.3]])
    adv = torch.tensor([[2.0, -1.0, 1.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = compute_policy_loss_cispo(log_prob, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    # weights: clip(1.5) = 1.2, clip(0.5) = 0.8, 1.1 unclipped; value -w A, gradient -w A
    torch.testing.assert_close(loss, torch.tensor([[-2.4, 0.8, -1.1, 0.0]], dtype=torch.float64))
    loss.sum().backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-2.4, 0.8, -1.1, 0.0]], dtype=torch.float64))
    assert float(metrics["pg_clipfrac"]) == pytest.approx(1 / 3)
    assert float(metrics["pg_clipfrac_lower"]) == pytest.approx(1 / 3)
    # PPO zeroes the gradient of the first token; CISPO does not (the point of the method)
    lp2 = log_prob.detach().clone().requires_grad_(True)
    ppo, _ = compute_policy_loss_ppo_clip(lp2, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    ppo.sum().backward()
    assert lp2.grad[0, 0] == 0


def test_cispo_without_lower_bound():
    old = torch.zeros(1, 1)
    log_prob = torch.tensor([[log(0.1)]], requires_grad=True)
    loss, _ = compute_policy_loss_cispo(
        log_prob, old, torch.tensor([[1.0]]), torch.ones(1, 1), clip_ratio_low=1.0, clip_ratio_high=0.28
    )
    assert float(loss.detach()) == pytest.approx(-0.1)


# -- through the plugin manager ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "cispo"])
def test_losses_resolve_and_take_config_parameters_by_name(pm, name):
    loss = pm.get("policy_loss", name)
    log_prob, old, adv, mask = ppo_batch()
    available = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}
    loss_mat, metrics = call_with_params(loss.fn, log_prob, old, adv, mask, available=available, extra={})
    assert loss_mat.shape == (1, 7) and loss_mat[0, -1] == 0
    for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "ratio_min", "ratio_max", "ratio_mean"):
        assert key in metrics


# -- end to end: every loss with every estimator learns a two-token bandit -------------------------


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(
    "adv_name,loss_name",
    [(a, "ppo_clip") for a in ["grpo", "dr_grpo", "rloo", "opo", "reinforce_plus_plus_baseline", "pass_at_k"]]
    + [("grpo", "gspo"), ("grpo", "cispo"), ("rloo", "gspo"), ("pass_at_k", "cispo")],
)
def test_a_tiny_policy_learns_with_every_estimator_and_loss(pm, adv_name, loss_name):
    # policy: an independent softmax over 4 actions at each of 2 positions; reward 1 only for
    # (2, 2), which starts at probability 1/16. Sign or stop-gradient mistakes would not learn it.
    est, loss_fn, agg = (
        pm.get("advantage_estimator", adv_name),
        pm.get("policy_loss", loss_name),
        pm.get("loss_aggregation", "seq-mean-token-mean"),
    )
    gen = torch.Generator().manual_seed(0)
    logits = torch.zeros(2, 4, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.1)
    groups, n = 8, 8
    index = torch.arange(groups).repeat_interleave(n)
    mask = torch.ones(groups * n, 2)
    pos = torch.arange(2)
    for _ in range(25):
        with torch.no_grad():
            probs = torch.softmax(logits, -1)
            actions = torch.stack(
                [torch.multinomial(probs[p], groups * n, replacement=True, generator=gen) for p in pos], dim=1
            )  # (B, 2)
            rewards = torch.zeros(groups * n, 2)
            rewards[:, 1] = (actions == 2).all(-1).float()
            old = torch.log_softmax(logits, -1)[pos, actions]
        adv, _ = call_with_params(
            est.fn,
            rewards,
            mask,
            index,
            available={"norm_adv_by_std": True},
            extra={"k": 2} if adv_name == "pass_at_k" else {},
        )
        for _ in range(2):  # two updates per batch: the second is off-policy, so the ratio and clip matter
            log_prob = torch.log_softmax(logits, -1)[pos, actions]
            loss_mat, _ = call_with_params(
                loss_fn.fn,
                log_prob,
                old,
                adv,
                mask,
                available={"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0},
            )
            opt.zero_grad()
            agg.fn(loss_mat, mask, global_num_tokens=None, global_num_seqs=None, norm_constant=2.0).backward()
            opt.step()
    p_success = float(torch.softmax(logits.detach(), -1)[:, 2].prod())
    assert p_success > 0.5, f"{adv_name} + {loss_name}: p(reward) = {p_success:.3f} after training (1/16 at the start)"
