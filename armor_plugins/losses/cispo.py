"""CISPO: clip the importance-sampling weight, never the token (MiniMax-M1, MiniMax 2025).

PPO's clip zeroes the gradient of a token whose ratio left the trust region; in long reasoning
traces those are often the rare "fork" tokens (however, recheck, wait...) that matter most. CISPO
keeps every token's gradient and bounds only its weight (MiniMax-M1 technical report)::

    J = sum_it sg(clip(r_it, 1 - eps_low, 1 + eps_high)) * A_it * log pi(y_it)

We write the per-token loss as ``-sg(w) * A * exp(log pi - sg(log pi))`` with
``w = clip(r, ...)``: the forward value is ``-w A`` (comparable with PPO's per-token surrogate,
so logged losses mean the same thing across losses), and the gradient is
``-w A grad log pi``, exactly CISPO's. The report sets no effective lower bound (a large
eps_low) and tunes eps_high; ``clip_ratio_low >= 1`` gives no lower bound here. The optional
token mask of the report's generalised form is not implemented.
"""

from __future__ import annotations

from typing import Any

import torch

from armor_core import PolicyLoss, hookimpl
from armor_core.hookspecs import RegisterPolicyLoss
from armor_core.ops.masked import masked_mean, upcast
from armor_plugins.losses.utils import LOG_RATIO_CLAMP, clamped_ratio, masked_inputs, policy_ratio_metrics

__all__ = ["compute_policy_loss_cispo"]


def compute_policy_loss_cispo(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    log_ratio_clamp: float = LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token CISPO loss: stop-gradient clipped IS weight times ``A * log pi``.

    :param log_prob: (bs, T) current log-probs (differentiable).
    :param old_log_prob: (bs, T) sampling-policy log-probs (no gradient).
    :param advantages: (bs, T); :param response_mask: (bs, T).
    :param clip_ratio_low: the weight is clipped below at ``max(1 - clip_ratio_low, 0)``.
    :param clip_ratio_high: the weight is clipped above at ``1 + clip_ratio_high``.
    :param log_ratio_clamp: ``log r`` is clamped to +-this before exp.
    :returns: ``(loss_mat (bs, T), metrics)``, 0 outside the mask. Metrics (detached, valid
        tokens): ``pg_clipfrac`` fraction of weights truncated above (r > 1 + eps_high),
        ``pg_clipfrac_lower`` truncated below, ``ppo_kl``, ``ppo_kl_k3``, ``ratio_min/max/mean``
        of the unclipped ratio.
    """
    if clip_ratio_low < 0 or clip_ratio_high < 0:
        raise ValueError(f"cispo: clip_ratio_low={clip_ratio_low}, clip_ratio_high={clip_ratio_high} must both be >= 0")
    log_ratio, ratio = clamped_ratio(log_prob, old_log_prob, response_mask, log_ratio_clamp)
    m, zero, adv = masked_inputs(advantages, response_mask, like=ratio)
    lp = torch.where(m, upcast(log_prob), zero)  # a NaN in padding must not reach the gradient

    low, high = max(1.0 - clip_ratio_low, 0.0), 1.0 + clip_ratio_high
    weight = ratio.detach().clamp(low, high)
    loss = -weight * adv * torch.exp(lp - lp.detach())
    loss_mat = torch.where(m, loss, zero)

    with torch.no_grad():
        metrics: dict[str, Any] = {
            "pg_clipfrac": masked_mean((ratio > high).to(ratio.dtype), m),
            "pg_clipfrac_lower": masked_mean((ratio < low).to(ratio.dtype), m),
        }
    metrics.update(policy_ratio_metrics(log_ratio, ratio, m))
    return loss_mat, metrics


@hookimpl
def armor_register_policy_losses(register: RegisterPolicyLoss) -> None:
    register(
        "cispo",
        PolicyLoss(
            fn=compute_policy_loss_cispo,
            description="CISPO: clipped, stop-gradient IS weight on every token (MiniMax-M1)",
        ),
    )
