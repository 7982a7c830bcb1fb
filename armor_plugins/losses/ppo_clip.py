"""PPO's clipped surrogate with asymmetric bounds (clip-higher) and dual-clip.

Per token, with ratio ``r = pi / pi_old`` and advantage ``A``::

    clipped = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))        PPO (Schulman et al. 2017)
    loss    = min(clipped, -A c)   if A < 0   else   clipped           dual-clip (Ye et al. 2020)

``eps_high > eps_low`` is DAPO's "clip-higher" (Yu et al. 2025): low-probability tokens with a
positive advantage may grow further before the clip stops them, which keeps entropy from
collapsing. Dual-clip bounds the loss of a negative-advantage token whose ratio has exploded
(r > c): plain PPO would keep pushing it with an unbounded ``-A r``.

The function returns the per-token loss; the configured aggregation turns it into the scalar.
"""

from __future__ import annotations

from typing import Any

import torch

from armor_core import PolicyLoss, hookimpl
from armor_core.hookspecs import RegisterPolicyLoss
from armor_core.ops.masked import masked_mean
from armor_plugins.losses.utils import LOG_RATIO_CLAMP, clamped_ratio, masked_inputs, policy_ratio_metrics

__all__ = ["compute_policy_loss_ppo_clip"]


def compute_policy_loss_ppo_clip(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    log_ratio_clamp: float = LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token PPO clip loss with clip-higher and dual-clip.

    :param log_prob: (bs, T) log-probs of the sampled tokens under the current policy (differentiable).
    :param old_log_prob: (bs, T) the same under the policy that sampled them (no gradient).
    :param advantages: (bs, T).
    :param response_mask: (bs, T), 1 for response tokens.
    :param clip_ratio_low: eps_low, the ratio is clipped below at ``1 - eps_low``.
    :param clip_ratio_high: eps_high, the ratio is clipped above at ``1 + eps_high``.
    :param clip_ratio_c: dual-clip bound c > 1 for negative advantages; None disables dual-clip.
    :param log_ratio_clamp: ``log(pi/pi_old)`` is clamped to +-this before exp (see
        ``utils.LOG_RATIO_CLAMP``), so no finite input gives Inf/NaN.
    :returns: ``(loss_mat (bs, T), metrics)``. ``loss_mat`` is 0 outside the mask. Metrics
        (detached, over valid tokens): ``pg_clipfrac`` the fraction where the upper bound binds
        (A > 0, r > 1 + eps_high: gradient zeroed), ``pg_clipfrac_lower`` where the lower bound
        binds (A < 0, r < 1 - eps_low), ``pg_clipfrac_dual`` where dual-clip binds (A < 0,
        r > c), plus ``ppo_kl``, ``ppo_kl_k3``, ``ratio_min/max/mean``.
    """
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(
            f"ppo_clip: clip_ratio_c={clip_ratio_c} must be > 1 (actor.clip_ratio_c), or None to disable dual-clip"
        )
    if clip_ratio_low < 0 or clip_ratio_high < 0:
        raise ValueError(
            f"ppo_clip: clip_ratio_low={clip_ratio_low}, clip_ratio_high={clip_ratio_high} must both be >= 0"
        )
    log_ratio, ratio = clamped_ratio(log_prob, old_log_prob, response_mask, log_ratio_clamp)
    m, zero, adv = masked_inputs(advantages, response_mask, like=ratio)

    low, high = 1.0 - clip_ratio_low, 1.0 + clip_ratio_high
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(low, high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    if clip_ratio_c is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * clip_ratio_c), loss)
    loss_mat = torch.where(m, loss, zero)

    with torch.no_grad():
        upper = (adv > 0) & (ratio > high)
        lower = (adv < 0) & (ratio < low)
        dual = (adv < 0) & (ratio > clip_ratio_c) if clip_ratio_c is not None else torch.zeros_like(m)
        metrics: dict[str, Any] = {
            "pg_clipfrac": masked_mean(upper.to(ratio.dtype), m),
            "pg_clipfrac_lower": masked_mean(lower.to(ratio.dtype), m),
            "pg_clipfrac_dual": masked_mean(dual.to(ratio.dtype), m),
        }
    metrics.update(policy_ratio_metrics(log_ratio, ratio, m))
    return loss_mat, metrics


@hookimpl
def armor_register_policy_losses(register: RegisterPolicyLoss) -> None:
    register(
        "ppo_clip",
        PolicyLoss(
            fn=compute_policy_loss_ppo_clip, description="PPO clip with clip-higher (eps_low/eps_high) and dual-clip"
        ),
    )
