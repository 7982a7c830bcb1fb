"""ReMax: REINFORCE with the policy's own greedy response as the baseline (Li et al. 2023, "ReMax: a
simple, effective, and efficient reinforcement learning method for aligning large language models").

For each prompt the step also generates one greedy response with the current policy and scores it
with the same reward; that score ``b`` is the baseline of every sample of the prompt::

    A_t = G_t - b,    G_t = sum_{t' >= t} r_t'   (the reward-to-go over valid tokens, no discount)

With outcome rewards (the score on the last token) ``G_t`` is the row's score at every token, so
``A = r - r_greedy``: a sample is pushed up when it beats what the policy would say greedily. The
greedy response is not trained on. ``returns`` are the ``G_t``. Unlike GRPO there is no division by a
standard deviation and no comparison between samples: one sample per prompt (``rollout.n=1``) works,
and a group whose samples all score alike still moves when they differ from the greedy score.

Same definition as verl 0.9.1's ``compute_remax_outcome_advantage`` (reward-to-go minus the baseline
at valid tokens); masked positions inside a response (a multi-turn observation) are skipped, not
summed, and are 0 in both outputs (verl leaves the reward-to-go there).
"""

from __future__ import annotations

from typing import Any

import torch

from armor_core import AdvantageEstimator, hookimpl
from armor_core.hookspecs import RegisterAdvantageEstimator
from armor_core.ops.groups import broadcast_to_tokens, discounted_returns

__all__ = ["compute_remax_advantage"]


def compute_remax_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    baseline_scores: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reward-to-go minus the greedy response's score.

    :param token_level_rewards: (bs, T).
    :param response_mask: (bs, T).
    :param index: (bs,) group ids; unused (the baseline is already per row).
    :param baseline_scores: (bs,) the score of the greedy response to each row's prompt, passed by the
        step because this estimator is registered with ``greedy_baseline=True``.
    :returns: ``(advantages, returns)``, both (bs, T), 0 outside the mask.
    """
    if baseline_scores is None:
        raise ValueError("remax needs baseline_scores (bs,): the greedy responses' scores, which the step passes")
    returns = discounted_returns(token_level_rewards, response_mask, 1.0)
    baseline = broadcast_to_tokens(baseline_scores.to(returns.device), response_mask, returns.dtype)
    return returns - baseline, returns


@hookimpl
def armor_register_advantage_estimators(register: RegisterAdvantageEstimator) -> None:
    register(
        "remax",
        AdvantageEstimator(
            fn=compute_remax_advantage,
            greedy_baseline=True,
            description="ReMax: reward minus the reward of the policy's greedy response to the same prompt",
        ),
    )
