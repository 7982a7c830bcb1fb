"""verl's ``grpo_passk`` advantage: only the best response of each group is rewarded, by its margin.

Matches ``compute_grpo_passk_outcome_advantage`` in verl's ``verl/trainer/ppo/core_algos.py``
(read on a stored snapshot of verl's main branch, not on the v0.9.1 tag). For a group of n >= 2
outcome scores, the response with the highest score gets ``r_max - r_second_max`` (divided by the
group's sample std + eps when ``norm_adv_by_std``); every other response gets 0.
Ties at the top give 0 to all: the margin is 0.

How it differs from ARMOR's ``pass_at_k`` (``pass_at_k.py``): that one is the closed-form Pass@k
advantage of Chen et al. 2025, averaged over all k-subsets, so every response of a group with a
signal gets a (possibly negative) advantage and k is a parameter. ``grpo_passk`` has no k: it
credits only the single best sample of the group with how much it beats the runner-up, a
"best-of-n" signal (verl cites arXiv 2503.19595). Use ``pass_at_k`` for the paper's objective,
``grpo_passk`` to reproduce verl runs.

Where ARMOR departs from verl, on purpose: a singleton group (or a group left with one valid row)
gets 0 instead of raising, as every other ARMOR grouped estimator does; fully masked rows are not
members of any group; scores are float64 (``armor_core.ops.groups.outcomes``), so ties are exact.
``returns`` equals ``advantages``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from armor_core import AdvantageEstimator, hookimpl
from armor_core.hookspecs import RegisterAdvantageEstimator
from armor_core.ops.groups import group_ids, outcomes

__all__ = ["compute_grpo_passk_advantage"]


def compute_grpo_passk_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std: bool = True,
    normalize_components: bool = False,
    reward_components: Sequence[Mapping[str, tuple[float, float]]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Best-of-group margin advantage.

    :param token_level_rewards: (bs, T); a row's score is its sum over valid tokens.
    :param response_mask: (bs, T).
    :param index: (bs,) group ids.
    :param epsilon: added to the group's std.
    :param norm_adv_by_std: divide the margin by the group's sample std (Bessel-corrected, as verl).
    :param normalize_components: standardise each reward component within its group first.
    :param reward_components: per row ``{domain: (score, weight)}``, passed by the trainer.
    :returns: ``(advantages, returns)``, both (bs, T), equal, 0 outside the mask and on every row
        but each group's (first) best.
    """
    o = outcomes(token_level_rewards, response_mask, index, normalize_components, reward_components)
    scores = o.scores
    adv = torch.zeros_like(scores)
    rows = torch.nonzero(o.valid).squeeze(-1)
    if rows.numel():
        sub = index.reshape(-1)[rows.to(index.device)] if isinstance(index, torch.Tensor) else _np_select(index, rows)
        gid, num_groups = group_ids(sub, rows.numel(), scores.device)
        for g in range(num_groups):
            members = rows[gid == g]
            if members.numel() < 2:
                continue  # no runner-up to beat
            r = scores[members]
            top, top_idx = torch.topk(r, 2)  # first of equal maxima, as torch.topk orders them
            margin = top[0] - top[1]
            if norm_adv_by_std:
                margin = margin / (r.std() + epsilon)
            adv[members[top_idx[0]]] = margin
    return o.to_tokens(adv)


def _np_select(index: Any, rows: torch.Tensor) -> Any:
    import numpy as np

    return np.asarray(index)[rows.cpu().numpy()]


@hookimpl
def armor_register_advantage_estimators(register: RegisterAdvantageEstimator) -> None:
    register(
        "grpo_passk",
        AdvantageEstimator(
            fn=compute_grpo_passk_advantage,
            grouped=True,
            description="verl's grpo_passk: the best response gets its margin over the runner-up",
        ),
    )
