"""RLOO: REINFORCE with a leave-one-out baseline (Kool et al. 2019; Ahmadian et al. 2024).

Each sample's baseline is the mean reward of the *other* samples of its prompt, so it is
independent of the sample itself and the estimator stays unbiased::

    A_i = r_i - (sum_j r_j - r_i) / (n - 1) = n / (n - 1) * (r_i - mean(r))

Edge cases (see ``armor_core.ops.groups``): a singleton group has no other sample, hence no baseline:
advantage 0 (use ``reinforce_plus_plus`` or ``gae`` when ``rollout.n`` is 1); groups with equal
rewards and fully masked rows also get exactly 0. ``returns`` equals ``advantages``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from armor_core import AdvantageEstimator, hookimpl
from armor_core.hookspecs import RegisterAdvantageEstimator
from armor_core.ops.groups import group_stats, outcomes

__all__ = ["compute_rloo_advantage"]


def compute_rloo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    normalize_components: bool = False,
    reward_components: Sequence[Mapping[str, tuple[float, float]]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Leave-one-out baseline within each group.

    :param token_level_rewards: (bs, T); a row's score is its sum over valid tokens.
    :param response_mask: (bs, T).
    :param index: (bs,) group ids.
    :param normalize_components: standardise each reward component within its group before the
        weighted sum (GDPO, ``armor_core.ops.groups.normalize_reward_components``); ``algorithm.adv_kwargs``.
    :param reward_components: per row ``{domain: (score, weight)}``, passed by the trainer.
    :returns: ``(advantages, returns)``, both (bs, T), equal, 0 outside the mask.
    """
    o = outcomes(token_level_rewards, response_mask, index, normalize_components, reward_components)
    stats = group_stats(o.scores, index, o.valid)
    n = stats.count
    adv = (o.scores - stats.mean) * n / (n - 1).clamp(min=1)
    return o.to_tokens(torch.where(stats.no_signal, torch.zeros_like(adv), adv))


@hookimpl
def armor_register_advantage_estimators(register: RegisterAdvantageEstimator) -> None:
    register(
        "rloo",
        AdvantageEstimator(fn=compute_rloo_advantage, grouped=True, description="RLOO: leave-one-out group baseline"),
    )
