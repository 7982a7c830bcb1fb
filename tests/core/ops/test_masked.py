"""``armor_core.ops.masked``: masked reductions ignore padding (even NaN/Inf), reduce nothing to 0, and
whiten exactly (no signal gives exact zeros, huge values stay finite)."""

from __future__ import annotations

import math

import pytest
import torch

from armor_core.ops.masked import masked_max, masked_mean, masked_min, masked_sum, masked_var, masked_whiten

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


def test_masked_sum_max_min_ignore_padding_and_take_an_empty_value():
    x = torch.tensor([[1.0, NAN, -2.0], [float("inf"), 4.0, 0.5]])
    m = torch.tensor([[True, False, True], [False, True, True]])
    assert float(masked_sum(x, m)) == pytest.approx(3.5)
    torch.testing.assert_close(masked_sum(x, m, dim=-1), torch.tensor([-1.0, 4.5]))
    assert float(masked_max(x, m)) == 4.0 and float(masked_min(x, m)) == -2.0
    nothing = torch.zeros(2, 3, dtype=torch.bool)
    assert float(masked_max(x, nothing, empty=1.0)) == 1.0 and float(masked_min(x, nothing, empty=-1.0)) == -1.0


def test_masked_var_of_half_precision_is_computed_in_float32():
    # every value is exact in bfloat16, but their sum (3096) is not: summed in bfloat16 the mean would be off
    x = torch.tensor([[1024.0, 1032.0, 1040.0]], dtype=torch.bfloat16)
    out = masked_var(x, torch.ones(1, 3))
    assert out.dtype == torch.bfloat16 and float(out) == 64.0
