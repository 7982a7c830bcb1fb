"""Shared tensor helpers: masked statistics, whitening, entropy, entropy bonus; and the critic's value loss."""

from __future__ import annotations

import math

import pytest
import torch

from armor_core.workers.critic import value_loss as compute_value_loss
from armor_plugins.losses.utils import (
    clamped_ratio,
    compute_entropy_loss,
    entropy_from_logits,
    masked_mean,
    masked_var,
    masked_whiten,
)

NAN = float("nan")


def test_masked_mean_and_var_ignore_padding_even_when_it_is_nan():
    x = torch.tensor([[1.0, 2.0, NAN], [3.0, float("inf"), 6.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert float(masked_mean(x, m)) == pytest.approx(3.0)  # (1+2+3+6)/4
    torch.testing.assert_close(masked_mean(x, m, dim=-1), torch.tensor([1.5, 4.5]))
    # deviations -2, -1, 0, 3: sum of squares 14; unbiased / 3, biased / 4
    assert float(masked_var(x, m)) == pytest.approx(14 / 3)
    assert float(masked_var(x, m, unbiased=False)) == pytest.approx(14 / 4)


def test_masked_reductions_of_nothing_are_zero():
    x = torch.tensor([[NAN, 1.0]])
    m = torch.zeros(1, 2)
    assert float(masked_mean(x, m)) == 0.0
    assert float(masked_var(x, m)) == 0.0
    assert float(masked_var(torch.tensor([[5.0]]), torch.ones(1, 1))) == 0.0  # one value: no variance
    assert torch.all(masked_whiten(x, m) == 0)


def test_masked_whiten_by_hand_and_no_signal_is_exact_zero():
    x = torch.tensor([[1.0, 2.0, 99.0], [3.0, 6.0, 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 1, 0]])
    sd = math.sqrt(14 / 3 + 1e-8)
    torch.testing.assert_close(masked_whiten(x, m), torch.tensor([[-2 / sd, -1 / sd, 0.0], [0.0, 3 / sd, 0.0]]))
    torch.testing.assert_close(
        masked_whiten(x, m, shift_mean=False), torch.tensor([[1 / sd, 2 / sd, 0.0], [3 / sd, 6 / sd, 0.0]])
    )
    same = torch.full((2, 3), 0.1)
    assert torch.all(masked_whiten(same, torch.ones(2, 3)) == 0)


def test_masked_whiten_of_huge_values_is_finite_and_right():
    x = torch.tensor([[1e20, -1e20, 3e20]])
    out = masked_whiten(x, torch.ones(1, 3))
    # same as whitening [1, -1, 3]: mean 1, unbiased var 4
    torch.testing.assert_close(out, torch.tensor([[0.0, -1.0, 1.0]]))


def test_entropy_from_logits_by_hand():
    logits = torch.tensor(
        [
            [[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3), -float("inf"), -float("inf")]],
            [[1e4, 0.0, -1e4, 5.0], [7.0, 7.0, 7.0, 7.0]],
        ]
    )
    h = entropy_from_logits(logits[:, :, :2].contiguous())
    assert h.shape == (2, 2)
    expected = torch.tensor([[math.log(2), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))], [0.0, math.log(2)]])
    torch.testing.assert_close(h, expected)
    assert float(entropy_from_logits(logits[:1, :1])) == pytest.approx(math.log(4))
    assert torch.isfinite(entropy_from_logits(logits[1:])).all()


def test_entropy_bonus_is_a_masked_per_token_loss():
    ent = torch.tensor([[1.0, 2.0, NAN]])
    out = compute_entropy_loss(ent, torch.tensor([[1, 1, 0]]), entropy_coeff=0.01)
    torch.testing.assert_close(out, torch.tensor([[-0.01, -0.02, 0.0]]))


def test_value_loss_clipping_by_hand():
    vpreds = torch.tensor([[2.0, 1.1, NAN]], requires_grad=True)
    values = torch.tensor([[1.0, 1.0, 1.0]])
    returns = torch.tensor([[3.0, 0.0, 5.0]])
    loss, metrics = compute_value_loss(vpreds, values, returns, torch.tensor([[1, 1, 0]]), cliprange_value=0.5)
    # token 0: unclipped (2-3)^2 = 1, clipped (1.5-3)^2 = 2.25 -> 0.5 * 2.25, the clipped term wins: no gradient
    # token 1: within the range, both (1.1)^2 -> 0.605, gradient (1.1 - 0) = 1.1
    torch.testing.assert_close(loss, torch.tensor([[1.125, 0.605, 0.0]]))
    loss.sum().backward()
    torch.testing.assert_close(vpreds.grad, torch.tensor([[0.0, 1.1, 0.0]]))
    assert float(metrics["vf_clipfrac"]) == pytest.approx(0.5)
    assert float(metrics["vpred_mean"]) == pytest.approx(1.55)


def test_clamped_ratio_upcasts_half_precision():
    lr, r = clamped_ratio(
        torch.tensor([[15.0]], dtype=torch.float16), torch.tensor([[0.0]], dtype=torch.float16), torch.ones(1, 1)
    )
    assert r.dtype == torch.float32 and torch.isfinite(r).all()  # exp(15) overflows float16
    assert float(r) == pytest.approx(math.exp(15), rel=1e-3)
