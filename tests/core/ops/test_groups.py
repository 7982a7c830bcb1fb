"""``armor_core.ops.groups``, the public helpers of advantage estimators, by hand: group ids of any kind,
group statistics over valid rows only, ``outcomes`` and its ``to_tokens``, discounted returns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from armor_core.ops.groups import discounted_returns, group_ids, group_stats, outcomes


def test_group_ids_take_tensors_strings_and_lists_and_check_the_length():
    gid, n = group_ids(np.array(["b", "a", "b"], dtype=object), 3)
    assert n == 2 and gid.tolist() == [1, 0, 1]
    assert group_ids([7, 7, 3], 3)[0].tolist() == [1, 1, 0]
    with pytest.raises(ValueError, match="index has 2 entries"):
        group_ids(torch.tensor([0, 1]), 3)


def test_group_stats_count_only_valid_rows():
    scores = torch.tensor([1.0, 3.0, 100.0, 5.0, 5.0], dtype=torch.float64)
    valid = torch.tensor([True, True, False, True, True])
    stats = group_stats(scores, [0, 0, 0, 1, 1], valid)
    assert stats.mean.tolist() == [2.0, 2.0, 2.0, 5.0, 5.0]  # the invalid 100 is left out
    assert stats.std[0].item() == pytest.approx(2**0.5)  # unbiased: ((1-2)^2 + (3-2)^2) / 1
    assert stats.count.tolist() == [2, 2, 2, 2, 2]
    assert stats.no_signal.tolist() == [False, False, True, True, True]  # invalid row; equal group
    weighted = group_stats(scores, [0, 0, 0, 1, 1], valid, weights=torch.tensor([3.0, 1.0, 1.0, 1.0, 1.0]))
    assert weighted.mean[0].item() == pytest.approx(1.5) and weighted.std[0].item() == pytest.approx(2**0.5)


def test_outcomes_sum_valid_tokens_and_to_tokens_keeps_the_mask_and_dtype():
    rewards = torch.tensor([[0.5, 1.0, 9.0], [2.0, 0.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.bfloat16)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    o = outcomes(rewards, mask, [0, 0, 1])
    assert o.scores.dtype == torch.float64 and o.scores.tolist() == [1.5, 2.0, 0.0]
    assert o.valid.tolist() == [True, True, False] and o.mask.dtype == torch.bool
    adv, ret = o.to_tokens(torch.tensor([1.0, -1.0, 5.0], dtype=torch.float64))
    assert adv.dtype == torch.bfloat16 and adv.tolist() == [[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert torch.equal(ret, adv) and ret.data_ptr() != adv.data_ptr()


def test_outcomes_normalise_components_only_when_asked():
    rewards = torch.tensor([[1.0], [0.0]])
    components = [{"a": (1.0, 1.0)}, {"a": (0.0, 1.0)}]
    assert outcomes(rewards, torch.ones(2, 1), [0, 0]).scores.tolist() == [1.0, 0.0]
    z = outcomes(rewards, torch.ones(2, 1), [0, 0], normalize_components=True, reward_components=components).scores
    s = 2**0.5 / 2  # std of (1, 0), unbiased
    assert z.tolist() == pytest.approx([0.5 / (s + 1e-6), -0.5 / (s + 1e-6)])
    with pytest.raises(ValueError, match="reward_components"):
        outcomes(rewards, torch.ones(2, 1), [0, 0], normalize_components=True)


def test_discounted_returns_skip_masked_positions():
    rewards = torch.tensor([[1.0, 5.0, 2.0, 0.0]])
    mask = torch.tensor([[1, 0, 1, 0]])
    # t=2: 2; t=1 is not a time step (its reward ignored); t=0: 1 + 0.5 * 2 = 2
    assert discounted_returns(rewards, mask, gamma=0.5).tolist() == [[2.0, 0.0, 2.0, 0.0]]
