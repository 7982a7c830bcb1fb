"""GRPO and Dr. GRPO: outcome advantages normalised within each prompt's group of samples.

GRPO (Shao et al. 2024, DeepSeekMath, outcome supervision): ``A_i = (r_i - mean(r)) / (std(r) + eps)``
over the G samples of one prompt, the same for every token of sample i. ``std`` is the unbiased
sample standard deviation (``torch.std``'s default, as in the reference implementations).

Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): dividing by the group std
up-weights prompts that are almost always or almost never solved; ``A_i = r_i - mean(r)``
removes that bias. Available as ``dr_grpo`` and as ``grpo`` with ``norm_adv_by_std: false``
(pair it with ``actor.loss_agg_mode: seq-mean-token-sum-norm`` to remove the length bias too).

Edge cases (see ``armor_core.ops.groups``): singleton groups, groups with all rewards equal and fully
masked rows get advantage exactly 0. ``returns`` equals ``advantages`` (there is no critic).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from armor_core import AdvantageEstimator, hookimpl
from armor_core.hookspecs import RegisterAdvantageEstimator
from armor_core.ops.groups import group_stats, outcomes

__all__ = ["compute_dr_grpo_advantage", "compute_grpo_advantage"]


def compute_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
    normalize_components: bool = False,
    reward_components: Sequence[Mapping[str, tuple[float, float]]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-normalised outcome advantage.

    :param token_level_rewards: (bs, T); a row's score is its sum over valid tokens.
    :param response_mask: (bs, T).
    :param index: (bs,) group ids (tensor, numpy array or list); samples of one prompt share one.
    :param epsilon: added to the group std (guards near-zero std; exactly-equal groups are 0 anyway).
    :param norm_adv_by_std: divide by the group std (GRPO) or not (Dr. GRPO).
    :param normalize_components: standardise each reward component within its group before the
        weighted sum (GDPO, ``armor_core.ops.groups.normalize_reward_components``); ``algorithm.adv_kwargs``.
    :param reward_components: per row ``{domain: (score, weight)}``, passed by the trainer.
    :returns: ``(advantages, returns)``, both (bs, T), equal, 0 outside the mask.
    """
    o = outcomes(token_level_rewards, response_mask, index, normalize_components, reward_components)
    stats = group_stats(o.scores, index, o.valid)
    adv = o.scores - stats.mean
    if norm_adv_by_std:
        adv = adv / (stats.std + epsilon)
    return o.to_tokens(torch.where(stats.no_signal, torch.zeros_like(adv), adv))


def compute_dr_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    normalize_components: bool = False,
    reward_components: Sequence[Mapping[str, tuple[float, float]]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dr. GRPO: ``r_i - mean(r)`` within each group, no std division. Parameters as :func:`compute_grpo_advantage`."""
    return compute_grpo_advantage(
        token_level_rewards,
        response_mask,
        index,
        norm_adv_by_std=False,
        normalize_components=normalize_components,
        reward_components=reward_components,
    )


@hookimpl
def armor_register_advantage_estimators(register: RegisterAdvantageEstimator) -> None:
    register(
        "grpo",
        AdvantageEstimator(
            fn=compute_grpo_advantage, grouped=True, description="GRPO: (r - group mean) / (group std + eps)"
        ),
    )
    register(
        "dr_grpo",
        AdvantageEstimator(
            fn=compute_dr_grpo_advantage, grouped=True, description="Dr. GRPO: r - group mean (no std division)"
        ),
    )
