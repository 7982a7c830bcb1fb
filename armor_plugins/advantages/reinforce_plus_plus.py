"""REINFORCE++ and REINFORCE++-baseline (Hu et al. 2025, "REINFORCE++: a simple and efficient
approach for aligning large language models").

``reinforce_plus_plus``: no critic and no groups. Per-token discounted returns
``G_t = r_t + gamma G_{t+1}`` (the KL penalty is meant to be folded into the token rewards,
``algorithm.use_kl_in_reward: true``), then the advantages are the returns whitened over every
valid token of the batch. Global whitening (rather than per prompt) is the paper's point: the
normalisation does not overfit small groups. ``returns`` are the unwhitened ``G_t``.

``reinforce_plus_plus_baseline``: for several samples per prompt. The group-mean reward is
subtracted first (removes the prompt's difficulty), the result is broadcast to the tokens and
whitened over the batch. Edge cases: singleton groups, groups with all rewards equal and fully
masked rows get advantage exactly 0: they are included in the batch statistics (as in the
paper) but set to 0 afterwards, since whitening would otherwise shift their 0 by the batch mean
and hand them a gradient without a signal. ``returns`` equals ``advantages``.

If every valid token of the batch has the same value, whitening gives exactly 0 (no signal).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from armor_core import AdvantageEstimator, hookimpl
from armor_core.hookspecs import RegisterAdvantageEstimator
from armor_core.ops.groups import broadcast_to_tokens, discounted_returns, group_stats, outcomes
from armor_core.ops.masked import as_bool_mask, masked_whiten

__all__ = ["compute_reinforce_plus_plus_advantage", "compute_reinforce_plus_plus_baseline_advantage"]


def compute_reinforce_plus_plus_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    gamma: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Discounted returns, whitened over all valid tokens of the batch.

    :param token_level_rewards: (bs, T), including any per-token KL penalty.
    :param response_mask: (bs, T); masked positions are skipped by the recursion.
    :param index: (bs,) group ids; unused (accepted because every estimator receives it).
    :param gamma: ``algorithm.gamma``.
    :returns: ``(advantages, returns)``, both (bs, T), 0 outside the mask; ``returns`` are the
        discounted returns before whitening.
    """
    m = as_bool_mask(response_mask)
    returns = discounted_returns(token_level_rewards, m, gamma)
    advantages = masked_whiten(returns, m)
    return advantages.to(token_level_rewards.dtype), returns.to(token_level_rewards.dtype)


def compute_reinforce_plus_plus_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    normalize_components: bool = False,
    reward_components: Sequence[Mapping[str, tuple[float, float]]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reward minus the group mean, broadcast to tokens, whitened over all valid tokens of the batch.

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
    centred = torch.where(stats.no_signal, torch.zeros_like(o.scores), o.scores - stats.mean)
    whitened = masked_whiten(broadcast_to_tokens(centred, o.mask, torch.float64), o.mask)
    whitened = torch.where(stats.no_signal.unsqueeze(-1), torch.zeros_like(whitened), whitened)
    out = whitened.to(token_level_rewards.dtype)
    return out, out.clone()


@hookimpl
def armor_register_advantage_estimators(register: RegisterAdvantageEstimator) -> None:
    register(
        "reinforce_plus_plus",
        AdvantageEstimator(
            fn=compute_reinforce_plus_plus_advantage, description="REINFORCE++: discounted returns, globally whitened"
        ),
    )
    register(
        "reinforce_plus_plus_baseline",
        AdvantageEstimator(
            fn=compute_reinforce_plus_plus_baseline_advantage,
            grouped=True,
            description="REINFORCE++-baseline: group-mean baseline, then global whitening",
        ),
    )
