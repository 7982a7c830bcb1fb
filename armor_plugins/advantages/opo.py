"""OPO: the length-weighted optimal baseline (Hao et al. 2025, "On-Policy RL with Optimal reward
Baseline").

For a sequence-level reward and a policy whose per-token score-function gradients are roughly
orthogonal with equal norms, the variance-minimising baseline weights each sample by its
length, since ``||grad log pi(y)||^2`` grows with the number of tokens::

    b = sum_j |y_j| r_j / sum_j |y_j|,        A_i = r_i - b

over the samples of one prompt. No std normalisation (the paper trains with exact on-policy
updates and this plain difference). ``|y_j|`` is the number of valid tokens of row j.

Edge cases (see ``armor_core.ops.groups``): singleton groups, groups with all rewards equal and fully
masked rows get advantage exactly 0 (a singleton's baseline is its own reward).
``returns`` equals ``advantages``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from armor_core import AdvantageEstimator, hookimpl
from armor_core.hookspecs import RegisterAdvantageEstimator
from armor_core.ops.groups import group_stats, outcomes

__all__ = ["compute_opo_advantage"]


def compute_opo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    normalize_components: bool = False,
    reward_components: Sequence[Mapping[str, tuple[float, float]]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reward minus the group's length-weighted mean reward.

    :param token_level_rewards: (bs, T); a row's score is its sum over valid tokens.
    :param response_mask: (bs, T); a row's length is its number of valid tokens.
    :param index: (bs,) group ids.
    :param normalize_components: standardise each reward component within its group before the
        weighted sum (GDPO, ``armor_core.ops.groups.normalize_reward_components``); ``algorithm.adv_kwargs``.
    :param reward_components: per row ``{domain: (score, weight)}``, passed by the trainer.
    :returns: ``(advantages, returns)``, both (bs, T), equal, 0 outside the mask.
    """
    o = outcomes(token_level_rewards, response_mask, index, normalize_components, reward_components)
    lengths = o.mask.sum(dim=-1).to(torch.float64)
    stats = group_stats(o.scores, index, o.valid, weights=lengths)
    return o.to_tokens(torch.where(stats.no_signal, torch.zeros_like(o.scores), o.scores - stats.mean))


@hookimpl
def armor_register_advantage_estimators(register: RegisterAdvantageEstimator) -> None:
    register(
        "opo",
        AdvantageEstimator(
            fn=compute_opo_advantage, grouped=True, description="OPO: reward minus the length-weighted group mean"
        ),
    )
