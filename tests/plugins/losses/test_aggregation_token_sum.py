"""The ``token-sum`` loss aggregation (verl's ``agg_loss`` mode of that name): by hand, over micro-batches, and
registration."""

from __future__ import annotations

import pytest
import torch

from armor_core import get_plugin
from armor_core.testing import check_loss_aggregation
from armor_plugins.losses.aggregation import agg_token_sum


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
