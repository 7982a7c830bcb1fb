"""GMPO: the geometric mean of the token ratios, clipped in log space (Zhao et al. 2025).

GRPO maximises the *arithmetic* mean of the tokens' surrogates, so one token with an extreme
ratio can dominate a sequence's update. GMPO (Geometric-Mean Policy Optimization,
arXiv:2507.20673) maximises their *geometric* mean, which an outlier moves far less::

    rho_i = exp( mean_t c_it ),   c_it = log r_it clipped on the side the advantage pushes:
            min(log r, clip(log r, -eps_low, eps_high))  if A > 0
            max(log r, clip(log r, -eps_low, eps_high))  if A < 0,   0 if A = 0
    J = mean_i  A_i * rho_i

The clip is in log space: ``clip_ratio_low/high`` bound ``log r``, so the paper's
``(e^-0.4, e^0.4)`` is ``actor.clip_ratio_low = actor.clip_ratio_high = 0.4`` (ARMOR's default
0.2 is a narrower band). ``A_i`` is the mean advantage of the sequence's valid tokens; like verl,
GMPO supports only sequence-level advantages (GRPO-style), and the clip side follows each
token's own advantage sign.

Per-token form, as in ``gspo``: every valid token of sequence ``i`` gets the loss
``-A_i * exp(sg[log rho_i] + c_it - sg[c_it])``, whose value is ``-A_i rho_i`` and whose gradient
is ``-A_i rho_i grad c_it``. Under ``actor.loss_agg_mode: seq-mean-token-mean`` the mean over a
sequence's tokens is then exactly ``-A_i rho_i`` with exactly its gradient, i.e. GMPO.

Matches ``compute_policy_loss_geo_mean`` of verl 0.9.1 (``verl/trainer/ppo/core_algos.py``).
Departures: verl ignores ``loss_agg_mode`` and averages over every row, fully masked ones
included; ARMOR's aggregation owns that choice and ``seq-mean-token-mean`` leaves fully masked
rows out (they have no tokens to learn from). verl does not clamp ``log r``; we clamp it to
+-20 first (``utils.LOG_RATIO_CLAMP``), so ``rho_i`` stays finite in fp32 on the unclipped side.
verl counts a token as clipped whenever ``log r`` leaves the band; we count it only where the
clip binds (the side the advantage pushes), the meaning ``pg_clipfrac`` has in ``ppo_clip``.
"""

from __future__ import annotations

from typing import Any

import torch

from armor_core import PolicyLoss, hookimpl
from armor_core.hookspecs import RegisterPolicyLoss
from armor_core.ops.masked import masked_mean, masked_sum
from armor_plugins.losses.utils import LOG_RATIO_CLAMP, clamped_ratio, masked_inputs, policy_ratio_metrics

__all__ = ["compute_policy_loss_geo_mean"]


def compute_policy_loss_geo_mean(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.4,
    clip_ratio_high: float = 0.4,
    log_ratio_clamp: float = LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token GMPO loss: ``-A_i`` times the geometric mean of the clipped token ratios.

    :param log_prob: (bs, T) current log-probs (differentiable).
    :param old_log_prob: (bs, T) sampling-policy log-probs (no gradient).
    :param advantages: (bs, T); expected constant over a sequence, its mean over valid tokens is used.
    :param response_mask: (bs, T).
    :param clip_ratio_low: ``log r`` is clipped below at ``-clip_ratio_low`` (for A < 0).
    :param clip_ratio_high: ``log r`` is clipped above at ``clip_ratio_high`` (for A > 0).
    :param log_ratio_clamp: ``log r`` is clamped to +-this first, so ``rho_i <= exp(clamp)``.
    :returns: ``(loss_mat (bs, T), metrics)``, ``loss_mat`` 0 outside the mask. Metrics (detached,
        valid tokens): ``pg_clipfrac`` (A > 0, log r > eps_high), ``pg_clipfrac_lower`` (A < 0,
        log r < -eps_low), ``ppo_kl``, ``ppo_kl_k3`` from the token ratios, ``ratio_min/max/mean``
        of the sequence ratio ``rho_i`` over tokens, ``seq_ratio_mean`` over sequences.
    """
    if clip_ratio_low < 0 or clip_ratio_high < 0:
        raise ValueError(
            f"geo_mean: clip_ratio_low={clip_ratio_low}, clip_ratio_high={clip_ratio_high} must both be >= 0"
        )
    log_ratio, ratio = clamped_ratio(log_prob, old_log_prob, response_mask, log_ratio_clamp)
    m, zero, adv = masked_inputs(advantages, response_mask, like=ratio)

    band = log_ratio.clamp(-clip_ratio_low, clip_ratio_high)
    clipped = torch.where(adv > 0, torch.minimum(log_ratio, band), torch.maximum(log_ratio, band))
    clipped = torch.where(m & (adv != 0), clipped, zero)  # A = 0: the token leaves the mean's sum out

    lengths = m.sum(dim=-1).clamp(min=1).to(ratio.dtype)
    seq_log_rho = masked_sum(clipped.detach(), m, dim=-1) / lengths
    seq_adv = masked_sum(adv, m, dim=-1) / lengths
    # value: log rho_i on every token; gradient: that token's clipped log-ratio
    log_rho = seq_log_rho.unsqueeze(-1) + clipped - clipped.detach()
    loss_mat = torch.where(m, -seq_adv.unsqueeze(-1) * torch.exp(log_rho), zero)

    with torch.no_grad():
        rho = torch.exp(seq_log_rho)
        metrics: dict[str, Any] = {
            "pg_clipfrac": masked_mean(((adv > 0) & (log_ratio > clip_ratio_high)).to(ratio.dtype), m),
            "pg_clipfrac_lower": masked_mean(((adv < 0) & (log_ratio < -clip_ratio_low)).to(ratio.dtype), m),
            "seq_ratio_mean": masked_mean(rho, m.any(dim=-1)),
        }
        token_metrics = policy_ratio_metrics(log_ratio, ratio, m)
        seq_metrics = policy_ratio_metrics(log_rho.detach(), torch.exp(log_rho.detach()), m)
    metrics["ppo_kl"] = token_metrics["ppo_kl"]
    metrics["ppo_kl_k3"] = token_metrics["ppo_kl_k3"]
    for key in ("ratio_min", "ratio_max", "ratio_mean"):
        metrics[key] = seq_metrics[key]
    return loss_mat, metrics


@hookimpl
def armor_register_policy_losses(register: RegisterPolicyLoss) -> None:
    register(
        "geo_mean",
        PolicyLoss(
            fn=compute_policy_loss_geo_mean,
            description="GMPO: geometric mean of the token ratios per sequence, clipped in log space",
        ),
    )
