"""What the policy losses share: the clamped ratio, entropy from logits; and the critic's value loss."""

from __future__ import annotations

import math

import pytest
import torch

from armor_core.workers.critic.worker import value_loss as compute_value_loss
from armor_plugins.losses.utils import clamped_ratio, entropy_from_logits

NAN = float("nan")


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
