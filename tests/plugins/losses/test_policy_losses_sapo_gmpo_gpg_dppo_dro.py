"""Policy losses SAPO, GMPO (``geo_mean``), GPG, DPPO (``dppo_tv``, ``dppo_kl``) and DRO (the shared checks):
hand-computed values and gradients, masking, parity with verl 0.9.1, and registration."""

from __future__ import annotations

import math

import pytest
import torch

from armor_core import get_plugin
from armor_core.testing import check_policy_loss
from armor_plugins.losses.aggregation import agg_seq_mean_token_mean, agg_token_mean
from armor_plugins.losses.dppo import binary_kl, compute_policy_loss_dppo_kl, compute_policy_loss_dppo_tv
from armor_plugins.losses.dro import compute_policy_loss_dro
from armor_plugins.losses.gmpo import compute_policy_loss_geo_mean
from armor_plugins.losses.gpg import compute_policy_loss_gpg
from armor_plugins.losses.sapo import compute_policy_loss_sapo

NAMES = ["sapo", "geo_mean", "gpg", "dppo_tv", "dppo_kl", "dro"]
FUNCTIONS = {
    "sapo": compute_policy_loss_sapo,
    "geo_mean": compute_policy_loss_geo_mean,
    "gpg": compute_policy_loss_gpg,
    "dppo_tv": compute_policy_loss_dppo_tv,
    "dppo_kl": compute_policy_loss_dppo_kl,
    "dro": compute_policy_loss_dro,
}
F64 = torch.float64


def log(x):
    return math.log(x)


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def leaf(values):
    return torch.tensor(values, dtype=F64, requires_grad=True)


def t64(values):
    return torch.tensor(values, dtype=F64)


# -- every loss here (and dro, tests/plugins/losses/test_dro.py): registration, masking, extreme inputs ----------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_registered_under_its_name_and_passes_the_contract_check(name):
    loss = get_plugin("policy_loss", name)
    assert loss.fn is FUNCTIONS[name]
    _, metrics = check_policy_loss(loss)
    for key in ("pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "ratio_min", "ratio_max", "ratio_mean"):
        assert key in metrics and math.isfinite(float(metrics[key])), key


@pytest.mark.parametrize("name", NAMES)
def test_padding_contributes_nothing_and_its_nan_does_not_leak(name):
    g = torch.Generator().manual_seed(3)
    old = torch.log(torch.rand(3, 5, generator=g, dtype=F64) * 0.9 + 0.05)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]])
    lp_values = (old + 0.2 * torch.randn(3, 5, generator=g, dtype=F64)).clamp(max=-1e-3)
    lp_values[mask == 0] = float("nan")
    adv = torch.randn(3, 1, generator=g, dtype=F64).expand(3, 5).clone()
    adv[mask == 0] = float("nan")
    log_prob = lp_values.clone().requires_grad_(True)
    loss, metrics = FUNCTIONS[name](log_prob, old, adv, mask)
    agg_token_mean(loss, mask).backward()
    assert torch.all(loss[mask == 0] == 0) and torch.all(log_prob.grad[mask == 0] == 0)
    assert torch.isfinite(loss).all() and torch.isfinite(log_prob.grad).all()
    assert all(math.isfinite(float(v)) for v in metrics.values())
    # row 1 equals the same computation with its padding cut away
    loss2, _ = FUNCTIONS[name](lp_values[1:2, :2], old[1:2, :2], adv[1:2, :2], mask[1:2, :2])
    torch.testing.assert_close(loss[1:2, :2].detach(), loss2)


@pytest.mark.parametrize("name", NAMES)
def test_extreme_log_ratios_stay_finite(name):
    log_prob = torch.tensor([[0.0, -1000.0, -1e-3]], requires_grad=True)
    old = torch.tensor([[-1000.0, 0.0, -1e-3]])
    loss, metrics = FUNCTIONS[name](log_prob, old, torch.tensor([[-1e6, 1e6, 1.0]]), torch.ones(1, 3))
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(log_prob.grad).all()
    assert all(math.isfinite(float(v)) for v in metrics.values())


# -- parity with verl 0.9.1 ---------------------------------------------------------------------------
# Inputs and expected numbers were produced once by running verl 0.9.1's own functions
# (verl/trainer/ppo/core_algos.py, from the PyPI wheel) on these inputs in a scratch script; only
# the numbers are kept. verl returns the aggregated scalar: SAPO always with seq-mean-token-mean,
# geo_mean as a mean over rows (= seq-mean-token-mean here, no row is fully masked), the others
# with token-mean. DPPO: verl's value is -w A log pi where ours is -w A (same gradient, see
# dppo.py), so only its gradient is compared.

PARITY_MASK = [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]]
PARITY_INPUTS = [
    (  # (old_log_prob, log_prob, per-sequence advantage)
        [
            [-2.2543, -1.3779, -1.3439, -1.5636],
            [-0.597, -1.9072, -0.7661, -0.3747],
            [-0.559, -0.6992, -0.6746, -1.0596],
        ],
        [[-2.313, -1.6676, -1.2172, -1.4834], [-0.7234, -2.0604, -1.2379, -0.4117], [-0.001, -1.2486, -0.195, -1.4427]],
        [0.3255, -0.4791, 1.379],
    ),
    (
        [
            [-0.1326, -1.9861, -0.3741, -0.6232],
            [-0.137, -0.6479, -1.8428, -1.237],
            [-0.3953, -0.7635, -2.0884, -0.4084],
        ],
        [
            [-0.5305, -2.3585, -0.4049, -0.9081],
            [-0.001, -0.7194, -1.8354, -1.3844],
            [-0.413, -1.2331, -1.9607, -0.8529],
        ],
        [-0.4766, 0.248, 0.1559],
    ),
]
# name -> (kwargs, aggregation, [(verl loss or None, verl gradient w.r.t. log_prob) per input])
VERL_0_9_1 = {
    "sapo": (
        {"tau_pos": 1.0, "tau_neg": 1.05},
        agg_seq_mean_token_mean,
        [
            (
                -0.9317868673,
                [
                    [-0.025557821, -0.0199850153, -0.0306489334, -0.0293388653],
                    [0.0467307001, 0.0454189277, 0.0319490856, 0.0],
                    [-0.3503446892, -0.1269271637, 0.0, 0.0],
                ],
            ),
            (
                0.0049599492,
                [
                    [0.0259018648, 0.026651439, 0.0385022763, 0.0293701459],
                    [-0.031402988, -0.0256236057, -0.0277598401, 0.0],
                    [-0.0255255102, -0.0156888439, 0.0, 0.0],
                ],
            ),
        ],
    ),
    "geo_mean": (
        {"clip_ratio_low": 0.1, "clip_ratio_high": 0.2},
        agg_seq_mean_token_mean,
        [
            (
                -0.3462125589,
                [[-0.0261822266] * 4, [0.0, 0.0, 0.0, 0.0], [0.0, -0.1929930928, 0.0, 0.0]],
            ),
            (
                0.0208556522,
                [[0.0, 0.0, 0.0365642472, 0.0], [-0.0282239478] * 3 + [0.0], [-0.0203647466] * 2 + [0.0, 0.0]],
            ),
        ],
    ),
    "gpg": (
        {},
        agg_token_mean,
        [
            (0.2190147256, [[-0.0361666667] * 4, [0.0532333333] * 3 + [0.0], [-0.1532222222] * 2 + [0.0, 0.0]]),
            (-0.1235786456, [[0.0529555556] * 4, [-0.0275555556] * 3 + [0.0], [-0.0173222222] * 2 + [0.0, 0.0]]),
        ],
    ),
    "dppo_tv": (
        {"clip_ratio_low": 0.05, "clip_ratio_high": 0.1, "clip_ratio_c": 1.3},
        agg_token_mean,
        [
            (
                None,
                [
                    [-0.0341047914, -0.0270703189, -0.0410519314, -0.0391867188],
                    [0.0, 0.0456719702, 0.0, 0.0],
                    [0.0, -0.0884545889, 0.0, 0.0],
                ],
            ),
            (
                None,
                [
                    [0.0, 0.0364905378, 0.0513493864, 0.0],
                    [0.0, -0.0256541196, -0.027760223, 0.0],
                    [-0.0170183164, -0.0108307596, 0.0, 0.0],
                ],
            ),
        ],
    ),
    "dppo_kl": (
        {"clip_ratio_low": 0.01, "clip_ratio_high": 0.02, "clip_ratio_c": 1.3},
        agg_token_mean,
        [
            (
                None,
                [
                    [-0.0341047914, -0.0270703189, -0.0410519314, -0.0391867188],
                    [0.0469125282, 0.0456719702, 0.0, 0.0],
                    [0.0, -0.0884545889, 0.0, 0.0],
                ],
            ),
            (
                None,
                [
                    [0.0, 0.0364905378, 0.0513493864, 0.0],
                    [0.0, -0.0256541196, -0.027760223, 0.0],
                    [-0.0170183164, -0.0108307596, 0.0, 0.0],
                ],
            ),
        ],
    ),
    "dro": (  # verl's dro_beta; token-mean (verl's compute_policy_loss_dro, 2026-12-04)
        {"beta": 0.1},
        agg_token_mean,
        [
            (
                0.2244875228,
                [
                    [-0.0368188889, -0.0393855556, -0.0347588889, -0.0352755556],
                    [0.0518288889, 0.0515311111, 0.0479911111, 0.0],
                    [-0.1470222222, -0.1593266667, 0.0, 0.0],
                ],
            ),
            (
                -0.1201140718,
                [
                    [0.0485344444, 0.0488177778, 0.0526133333, 0.04979],
                    [-0.0260444444, -0.02835, -0.0274733333, 0.0],
                    [-0.0175188889, -0.02254, 0.0, 0.0],
                ],
            ),
        ],
    ),
}


@pytest.mark.parametrize("case", [0, 1])
@pytest.mark.parametrize("name", NAMES)
def test_matches_verl_0_9_1(name, case):
    kwargs, aggregate, expected = VERL_0_9_1[name]
    old, new, seq_adv = PARITY_INPUTS[case]
    verl_loss, verl_grad = expected[case]
    mask = torch.tensor(PARITY_MASK)
    log_prob = leaf(new)
    adv = t64(seq_adv).unsqueeze(-1).expand(3, 4)
    loss_mat, _ = FUNCTIONS[name](log_prob, t64(old), adv, mask, **kwargs)
    loss = aggregate(loss_mat, mask)
    loss.backward()
    if verl_loss is not None:
        # verl divides a sequence's token sum by (length + 1e-8): a relative difference of ~1e-9
        assert float(loss.detach()) == pytest.approx(verl_loss, rel=1e-7, abs=1e-9)
    torch.testing.assert_close(log_prob.grad, t64(verl_grad), rtol=1e-7, atol=1e-9)


# -- SAPO -----------------------------------------------------------------------------------------------


def test_sapo_hand_computed_values_and_gradients():
    # (log r, A): tau_pos = 1 for A > 0, tau_neg = 2 for A <= 0
    old = torch.zeros(1, 5, dtype=F64)
    log_prob = leaf([[0.0, 0.0, log(3.0), log(0.5), float("nan")]])
    adv = t64([[2.0, -1.0, 1.0, -1.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, metrics = compute_policy_loss_sapo(log_prob, old, adv, mask, tau_pos=1.0, tau_neg=2.0)
    # gate (4 / tau) sigmoid(tau (r - 1)); loss -gate * A
    expected = [-2.0 * 2.0, 1.0, -4.0 * sigmoid(2.0), (4.0 / 2.0) * sigmoid(-1.0)]
    torch.testing.assert_close(loss, t64([expected + [0.0]]))
    loss.sum().backward()

    def weight(r, tau):  # d gate / d log pi = r * 4 s (1 - s), s = sigmoid(tau (r - 1))
        s = sigmoid(tau * (r - 1))
        return r * 4 * s * (1 - s)

    grads = [-2.0 * 1.0, 1.0 * 1.0, -1.0 * weight(3.0, 1.0), 1.0 * weight(0.5, 2.0), 0.0]
    torch.testing.assert_close(log_prob.grad, t64([grads]))
    assert float(metrics["pg_clipfrac"]) == 0.0
    assert float(metrics["sapo_weight_mean"]) == pytest.approx((1 + 1 + weight(3.0, 1.0) + weight(0.5, 2.0)) / 4)


def test_sapo_at_ratio_one_is_the_plain_policy_gradient():
    # a tiny softmax policy: on-policy (r = 1) SAPO's gradient w.r.t. the logits is GPG's -A grad log pi
    g = torch.Generator().manual_seed(0)
    actions = torch.randint(0, 5, (4, 3), generator=g)
    adv = torch.randn(4, 1, generator=g, dtype=F64).expand(4, 3)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    grads = {}
    for name, kwargs in (
        ("sapo", {"tau_pos": 1.0, "tau_neg": 1.05}),
        ("sapo_hot", {"tau_pos": 7.0, "tau_neg": 3.0}),
        ("gpg", {}),
    ):
        logits = torch.randn(3, 5, generator=torch.Generator().manual_seed(1), dtype=F64, requires_grad=True)
        log_prob = torch.log_softmax(logits, -1)[torch.arange(3), actions]
        fn = compute_policy_loss_gpg if name == "gpg" else compute_policy_loss_sapo
        loss_mat, _ = fn(log_prob, log_prob.detach(), adv, mask, **kwargs)
        agg_seq_mean_token_mean(loss_mat, mask).backward()
        grads[name] = logits.grad
    assert grads["gpg"].abs().sum() > 0
    torch.testing.assert_close(grads["sapo"], grads["gpg"])
    torch.testing.assert_close(grads["sapo_hot"], grads["gpg"])


def test_sapo_temperatures_act_on_their_own_advantage_sign():
    # the same ratio 1.5 and |A| = 1: the larger temperature damps its side's gradient more
    old = torch.zeros(1, 2, dtype=F64)
    adv = t64([[1.0, -1.0]])
    mask = torch.ones(1, 2)

    def grad_magnitudes(tau_pos, tau_neg):
        log_prob = leaf([[log(1.5), log(1.5)]])
        loss, _ = compute_policy_loss_sapo(log_prob, old, adv, mask, tau_pos=tau_pos, tau_neg=tau_neg)
        loss.sum().backward()
        return log_prob.grad.abs()[0].tolist()

    pos, neg = grad_magnitudes(1.0, 4.0)
    assert pos > neg > 0
    swapped_pos, swapped_neg = grad_magnitudes(4.0, 1.0)
    assert swapped_pos == pytest.approx(neg) and swapped_neg == pytest.approx(pos)
    equal_pos, equal_neg = grad_magnitudes(2.0, 2.0)
    assert equal_pos == pytest.approx(equal_neg)
    # changing tau_neg leaves the positive-advantage token alone
    assert grad_magnitudes(1.0, 9.0)[0] == pytest.approx(pos)


def test_sapo_rejects_non_positive_temperatures():
    with pytest.raises(ValueError, match="tau_neg=0.0 must both be > 0"):
        compute_policy_loss_sapo(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1), tau_neg=0.0)


# -- GMPO (geo_mean) --------------------------------------------------------------------------------


def test_geo_mean_hand_computed_and_equal_to_the_sequence_objective():
    # eps_low = 0.1, eps_high = 0.2, in log space
    # seq 0, A = +1: log r = 0.1, 0.3 -> clipped 0.1, 0.2 (binds) -> log rho = 0.15
    # seq 1, A = -1: log r = -0.3, 0.3 -> clipped -0.1 (binds), 0.3 (the upper clip cannot bind for A < 0)
    # seq 2, A = 0.5: one token, log r = 0.05; its padding is NaN
    old = t64([[-1.0, -2.0, 0.0], [-1.0, -1.0, 0.0], [-0.5, 0.0, 0.0]])
    log_prob = leaf([[-0.9, -1.7, 0.0], [-1.3, -0.7, 0.0], [-0.45, float("nan"), float("nan")]])
    adv = t64([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.0], [0.5, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0]])
    loss_mat, metrics = compute_policy_loss_geo_mean(log_prob, old, adv, mask, clip_ratio_low=0.1, clip_ratio_high=0.2)
    e0, e1, e2 = math.exp(0.15), math.exp(0.1), math.exp(0.05)
    torch.testing.assert_close(loss_mat, t64([[-e0, -e0, 0.0], [e1, e1, 0.0], [-0.5 * e2, 0.0, 0.0]]))
    loss = agg_seq_mean_token_mean(loss_mat, mask)
    loss.backward()
    # d(-A rho)/d log pi_t = -A rho / |y| where the clip does not bind; / 3 sequences
    expected_grad = t64([[-e0 / 6, 0.0, 0.0], [0.0, e1 / 6, 0.0], [-0.5 * e2 / 3, 0.0, 0.0]])
    torch.testing.assert_close(log_prob.grad, expected_grad)

    # GMPO's sequence objective written directly: -mean_i A_i exp(mean_t clipped log r)
    lp2 = log_prob.detach()[:, :2].clone().requires_grad_(True)
    rows = []
    for i, (a, n) in enumerate([(1.0, 2), (-1.0, 2), (0.5, 1)]):
        x = lp2[i, :n] - old[i, :n]
        band = x.clamp(-0.1, 0.2)
        clipped = torch.minimum(x, band) if a > 0 else torch.maximum(x, band)
        rows.append(-a * torch.exp(clipped.mean()))
    direct = torch.stack(rows).mean()
    direct.backward()
    torch.testing.assert_close(loss, direct.detach())
    torch.testing.assert_close(log_prob.grad[:, :2], lp2.grad)

    assert float(metrics["pg_clipfrac"]) == pytest.approx(1 / 5)
    assert float(metrics["pg_clipfrac_lower"]) == pytest.approx(1 / 5)
    assert float(metrics["seq_ratio_mean"]) == pytest.approx((e0 + e1 + e2) / 3)


def test_geo_mean_damps_an_outlier_token_compared_with_the_arithmetic_mean():
    # one token with ratio 10 among ratios 1: the geometric mean moves far less than the arithmetic one
    old = torch.zeros(1, 4, dtype=F64)
    log_prob = t64([[log(10.0), 0.0, 0.0, 0.0]])
    loss, metrics = compute_policy_loss_geo_mean(
        log_prob, old, t64([[-1.0] * 4]), torch.ones(1, 4), clip_ratio_low=0.4, clip_ratio_high=0.4
    )
    assert float(metrics["seq_ratio_mean"]) == pytest.approx(10 ** (1 / 4))  # A < 0: the upper side is not clipped
    assert float(metrics["seq_ratio_mean"]) < (10 + 3) / 4


# -- GPG ----------------------------------------------------------------------------------------------


def test_gpg_is_minus_advantage_times_log_prob_and_ignores_the_old_policy():
    log_prob = leaf([[-0.5, -2.0, float("nan")]])
    adv = t64([[2.0, -1.0, 3.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, metrics = compute_policy_loss_gpg(log_prob, t64([[-0.5, -1.0, 0.0]]), adv, mask)
    torch.testing.assert_close(loss, t64([[1.0, -2.0, 0.0]]))
    loss.sum().backward()
    torch.testing.assert_close(log_prob.grad, t64([[-2.0, 1.0, 0.0]]))
    assert float(metrics["ratio_min"]) == pytest.approx(math.exp(-1.0))  # reported, not used
    other, _ = compute_policy_loss_gpg(log_prob.detach(), t64([[-9.0, -9.0, -9.0]]), adv, mask)
    torch.testing.assert_close(other, loss.detach())


# -- DPPO ---------------------------------------------------------------------------------------------

# p_old = 0.5 for the first five tokens; (A, p): thresholds 0.1 (TV) / 0.05 (binary KL), c = 1.5
DPPO_CASES = [
    (1.0, 0.55),  # rose a little: kept, w = 1.1
    (1.0, 0.7),  # rose too far for A > 0: dropped
    (-1.0, 0.3),  # fell too far for A < 0: dropped
    (-1.0, 0.9),  # rose, A < 0: kept, r = 1.8 truncated to 1.5
    (2.0, 0.2),  # fell, A > 0: kept, w = 0.4
]


def dppo_batch():
    old = t64([[log(0.5)] * 5 + [log(0.9), 0.0]])
    log_prob = leaf([[log(p) for _, p in DPPO_CASES] + [log(0.99), float("nan")]])  # last: padding
    adv = t64([[a for a, _ in DPPO_CASES] + [1.0, 5.0]])
    return log_prob, old, adv, torch.tensor([[1] * 6 + [0]])


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
def test_dppo_keeps_tokens_inside_the_divergence_bound_with_truncated_weights(name):
    thresholds = {"dppo_tv": 0.1, "dppo_kl": 0.05}[name]
    log_prob, old, adv, mask = dppo_batch()
    loss, metrics = FUNCTIONS[name](
        log_prob, old, adv, mask, clip_ratio_low=thresholds, clip_ratio_high=thresholds, clip_ratio_c=1.5
    )
    # the sixth token: p_old = 0.9 -> 0.99, A > 0. TV moved 0.09 <= 0.1: kept (w = 1.1); binary
    # KL(0.9 || 0.99) = 0.144 > 0.05: dropped. Near certainty KL is the tighter bound.
    last = -1.1 if name == "dppo_tv" else 0.0
    expected = t64([[-1.1, 0.0, 0.0, 1.5, -0.8, last, 0.0]])
    torch.testing.assert_close(loss, expected)  # value -w A on kept tokens
    loss.sum().backward()
    torch.testing.assert_close(log_prob.grad, expected)  # gradient -w A d log pi
    assert float(metrics["pg_clipfrac"]) == pytest.approx((1 if name == "dppo_tv" else 2) / 6)
    assert float(metrics["pg_clipfrac_lower"]) == pytest.approx(1 / 6)
    assert float(metrics["pg_truncfrac"]) == pytest.approx(1 / 6)


def test_dppo_without_truncation_uses_the_full_ratio():
    log_prob, old, adv, mask = dppo_batch()
    loss, _ = compute_policy_loss_dppo_tv(
        log_prob, old, adv, mask, clip_ratio_low=0.1, clip_ratio_high=0.1, clip_ratio_c=None
    )
    assert float(loss[0, 3].detach()) == pytest.approx(1.8)


def test_binary_kl_matches_its_formula():
    def kl(a, b):
        return a * log(a / b) + (1 - a) * log((1 - a) / (1 - b))

    pairs = [(0.5, 0.55), (0.5, 0.2), (0.9, 0.99), (0.01, 0.05)]
    got = binary_kl(t64([log(a) for a, _ in pairs]), t64([log(b) for _, b in pairs]))
    torch.testing.assert_close(got, t64([kl(a, b) for a, b in pairs]), rtol=1e-6, atol=1e-9)
    # fp32 at the edges: p_old = p = 1, and a probability moving between 0 and 1 either way
    edges = binary_kl(torch.tensor([0.0, -1000.0, 0.0]), torch.tensor([0.0, 0.0, -1000.0]))
    assert edges.dtype == torch.float32 and torch.isfinite(edges).all()
