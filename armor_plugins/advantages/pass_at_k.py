"""Pass@k training advantage (Chen et al. 2025, "Pass@k Training for Adaptively Balancing
Exploration and Exploitation of Large Reasoning Models"), in closed form.

Pass@k rewards a *set* of k responses with the best of them. For a group of n responses, take
every k-subset as one "super-response" with reward ``max`` over its members; normalise those
rewards over all C(n, k) subsets (mean R, population std s); a response's advantage is the mean
normalised reward of the subsets that contain it. Sorting the group ascending
(``v_1 <= ... <= v_n``) makes every quantity a weighted sum, exactly and without sampling subsets:

* the max of a subset is ``v_j`` in ``C(j-1, k-1)`` subsets, so
  ``R = sum_j v_j C(j-1, k-1) / C(n, k)`` and ``s^2 = sum_j v_j^2 C(j-1, k-1) / C(n, k) - R^2``;
* of the ``C(n-1, k-1)`` subsets containing response i, ``C(i-1, k-1)`` have max ``v_i`` and
  ``C(j-2, k-2)`` have max ``v_j`` for each j > i, so
  ``mean_i = (v_i C(i-1, k-1) + sum_{j>i} v_j C(j-2, k-2)) / C(n-1, k-1)``;
* ``A_i = (mean_i - R) / (s + eps)`` (or ``mean_i - R`` without std normalisation).

For binary rewards this is the paper's analytical form: a correct response gets
``(1 - R) / s`` and an incorrect one ``(1 - R - C(n_neg - 1, k - 1) / C(n - 1, k - 1)) / s`` with
``R = 1 - C(n_neg, k) / C(n, k)``; for k = 1 it is GRPO with the population std. Continuous
rewards use the same max-of-subset definition.

Edge cases: a group smaller than k uses k = its size; singleton groups and fully masked rows
get 0; when every k-subset has the same max (``v_k == v_n``: e.g. at least n - k + 1 correct
responses) there is no signal and the advantage is exactly 0. Cost: O(n^2) per group, batched
over groups of equal size. ``returns`` equals ``advantages``.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from armor_core import AdvantageEstimator, hookimpl
from armor_core.hookspecs import RegisterAdvantageEstimator
from armor_core.ops.groups import group_ids, outcomes

__all__ = ["compute_pass_at_k_advantage", "pass_at_k_weights"]


def _comb(n: int, r: int) -> int:
    return math.comb(n, r) if 0 <= r <= n else 0


@functools.lru_cache(maxsize=64)
def pass_at_k_weights(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights for a sorted group of ``n`` with subsets of ``k``, float64.

    :returns: ``(w, W)``: ``w`` (n,) with ``R = w @ v_sorted``; ``W`` (n, n) with
        ``mean = W @ v_sorted``. Ratios of exact integers, rounded once.
    """
    w = torch.tensor([_comb(j - 1, k - 1) / _comb(n, k) for j in range(1, n + 1)], dtype=torch.float64)
    denom = _comb(n - 1, k - 1)
    W = torch.zeros(n, n, dtype=torch.float64)
    for i in range(1, n + 1):
        W[i - 1, i - 1] = _comb(i - 1, k - 1) / denom
        for j in range(i + 1, n + 1):
            W[i - 1, j - 1] = _comb(j - 2, k - 2) / denom
    return w, W


def compute_pass_at_k_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    k: int | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
    normalize_components: bool = False,
    reward_components: Sequence[Mapping[str, tuple[float, float]]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k advantage of every response, from its group's rewards.

    :param token_level_rewards: (bs, T); a row's score is its sum over valid tokens.
    :param response_mask: (bs, T).
    :param index: (bs,) group ids.
    :param k: subset size, from ``algorithm.adv_kwargs.k`` (required, >= 1).
    :param epsilon: added to the subset-reward std.
    :param norm_adv_by_std: divide by that std (the paper does).
    :param normalize_components: standardise each reward component within its group before the
        weighted sum (GDPO, ``armor_core.ops.groups.normalize_reward_components``); ``algorithm.adv_kwargs``.
    :param reward_components: per row ``{domain: (score, weight)}``, passed by the trainer.
    :returns: ``(advantages, returns)``, both (bs, T), equal, 0 outside the mask.
    """
    if k is None:
        raise ValueError("pass_at_k needs k: set algorithm.adv_kwargs.k (e.g. {k: 4}), at most rollout.n")
    if int(k) != k or k < 1:
        raise ValueError(f"pass_at_k: k={k!r} must be an integer >= 1 (algorithm.adv_kwargs.k)")
    k = int(k)
    o = outcomes(token_level_rewards, response_mask, index, normalize_components, reward_components)
    scores = o.scores
    adv = torch.zeros_like(scores)

    rows = torch.nonzero(o.valid).squeeze(-1)
    if rows.numel():
        gid, _ = group_ids(_select(index, rows), rows.numel(), scores.device)
        # make each group's rows contiguous, then handle all groups of one size as a (G, n) matrix
        gid_sorted, order = torch.sort(gid, stable=True)
        counts = torch.bincount(gid_sorted)
        starts = torch.cumsum(counts, 0) - counts
        for n in sorted(set(counts.tolist())):
            if n < 2:
                continue  # singleton: no other sample to compare with
            groups = torch.nonzero(counts == n).squeeze(-1)
            members = rows[order[starts[groups].unsqueeze(-1) + torch.arange(n, device=scores.device)]]  # (G, n)
            adv[members] = _group_pass_at_k(scores[members], min(k, n), epsilon, norm_adv_by_std)

    return o.to_tokens(adv)


def _select(index: Any, rows: torch.Tensor) -> Any:
    if isinstance(index, torch.Tensor):
        return index.reshape(-1)[rows.to(index.device)]
    return np.asarray(index)[rows.cpu().numpy()]


def _group_pass_at_k(values: torch.Tensor, k: int, epsilon: float, norm_adv_by_std: bool) -> torch.Tensor:
    """(G, n) float64 scores of G groups of n -> (G, n) advantages."""
    n = values.shape[1]
    w, W = (t.to(values.device) for t in pass_at_k_weights(n, k))
    v, perm = torch.sort(values, dim=1)
    mean_subset = v @ w  # (G,)
    var_subset = (v * v) @ w - mean_subset * mean_subset
    adv_sorted = v @ W.T - mean_subset.unsqueeze(-1)
    if norm_adv_by_std:
        adv_sorted = adv_sorted / (var_subset.clamp(min=0).sqrt() + epsilon).unsqueeze(-1)
    no_signal = v[:, k - 1] == v[:, n - 1]  # the smallest possible subset max equals the largest
    adv_sorted = torch.where(no_signal.unsqueeze(-1), torch.zeros_like(adv_sorted), adv_sorted)
    return torch.empty_like(adv_sorted).scatter_(1, perm, adv_sorted)


@hookimpl
def armor_register_advantage_estimators(register: RegisterAdvantageEstimator) -> None:
    register(
        "pass_at_k",
        AdvantageEstimator(
            fn=compute_pass_at_k_advantage,
            grouped=True,
            description="Pass@k training advantage (Chen et al. 2025), k from adv_kwargs",
        ),
    )
