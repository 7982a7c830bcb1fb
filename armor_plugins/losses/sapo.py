"""SAPO: a smooth, temperature-controlled gate on the importance ratio (Gao et al. 2025, Qwen team).

PPO's clip is a cliff: inside the trust region a token gets the full gradient, outside it none.
SAPO (Soft Adaptive Policy Optimization, arXiv:2511.20347) replaces the clipped surrogate with a
soft gate of the ratio ``r = pi / pi_old``::

    f_tau(r) = (4 / tau) * sigmoid(tau * (r - 1))          loss = -f_tau(r) * A

Its gradient with respect to ``log pi`` is ``-A * w(r)`` with ``w(r) = r * 4 s (1 - s)``,
``s = sigmoid(tau (r - 1))``: ``w(1) = 1`` (on-policy it *is* the plain policy gradient
``-A grad log pi``), and ``w`` decays smoothly as ``r`` leaves 1, faster for a larger ``tau``.
The value at ``r = 1`` is ``-2 A / tau``, not ``-A``: the logged ``pg_loss`` is on another scale
than ``ppo_clip``'s (we keep the paper's gate rather than shift it, so values match verl's).
Tokens with ``A > 0`` use ``tau_pos``, the others ``tau_neg``; the paper (and verl) take
``tau_neg > tau_pos`` (1.05 and 1.0) because pushing a token's probability down spreads mass over
the whole vocabulary and destabilises training sooner than pushing it up.

Matches ``compute_policy_loss_sapo`` of verl 0.9.1 (``verl/trainer/ppo/core_algos.py``) token
for token. Departures: verl aggregates SAPO with ``seq-mean-token-mean`` whatever
``loss_agg_mode`` says; in ARMOR the configured aggregation owns that choice (a loss never
overrides it), so set ``actor.loss_agg_mode: seq-mean-token-mean`` for the paper's objective. verl
reports ``pg_clipfrac`` 0; we report the same keys (0: nothing is clipped) and add
``sapo_weight_mean``, the mean gradient weight ``w(r)``, which shows how far the gate damps.
Set the temperatures with ``actor.policy_loss_kwargs: {tau_pos: ..., tau_neg: ...}``.
"""

from __future__ import annotations

from typing import Any

import torch

from armor_core import PolicyLoss, hookimpl
from armor_core.hookspecs import RegisterPolicyLoss
from armor_core.ops.masked import masked_mean
from armor_plugins.losses.utils import LOG_RATIO_CLAMP, clamped_ratio, masked_inputs, policy_ratio_metrics

__all__ = ["compute_policy_loss_sapo"]


def compute_policy_loss_sapo(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    log_ratio_clamp: float = LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token SAPO loss ``-(4 / tau) * sigmoid(tau * (r - 1)) * A``.

    :param log_prob: (bs, T) current log-probs (differentiable).
    :param old_log_prob: (bs, T) sampling-policy log-probs (no gradient).
    :param advantages: (bs, T); :param response_mask: (bs, T).
    :param tau_pos: gate temperature for tokens with ``A > 0`` (> 0).
    :param tau_neg: gate temperature for tokens with ``A <= 0`` (> 0).
    :param log_ratio_clamp: ``log r`` is clamped to +-this before exp.
    :returns: ``(loss_mat (bs, T), metrics)``, 0 outside the mask. Metrics (detached, valid
        tokens): ``pg_clipfrac`` and ``pg_clipfrac_lower`` (0: SAPO clips nothing),
        ``sapo_weight_mean`` the mean of ``w(r)`` (1 on-policy), ``ppo_kl``, ``ppo_kl_k3``,
        ``ratio_min/max/mean``.
    """
    if not (tau_pos > 0 and tau_neg > 0):
        raise ValueError(f"sapo: tau_pos={tau_pos}, tau_neg={tau_neg} must both be > 0 (actor.policy_loss_kwargs)")
    log_ratio, ratio = clamped_ratio(log_prob, old_log_prob, response_mask, log_ratio_clamp)
    m, zero, adv = masked_inputs(advantages, response_mask, like=ratio)

    tau = torch.where(adv > 0, ratio.new_tensor(tau_pos), ratio.new_tensor(tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    loss_mat = torch.where(m, -gate * adv, zero)

    with torch.no_grad():
        s = torch.sigmoid(tau * (ratio - 1.0))
        metrics: dict[str, Any] = {
            "pg_clipfrac": torch.zeros((), dtype=ratio.dtype, device=ratio.device),
            "pg_clipfrac_lower": torch.zeros((), dtype=ratio.dtype, device=ratio.device),
            "sapo_weight_mean": masked_mean(ratio * 4.0 * s * (1.0 - s), m)
            if bool(m.any())
            else torch.ones((), dtype=ratio.dtype, device=ratio.device),
        }
    metrics.update(policy_ratio_metrics(log_ratio, ratio, m))
    return loss_mat, metrics


@hookimpl
def armor_register_policy_losses(register: RegisterPolicyLoss) -> None:
    register(
        "sapo",
        PolicyLoss(
            fn=compute_policy_loss_sapo,
            description="SAPO: soft sigmoid gate on the ratio, separate temperatures for A > 0 and A <= 0",
        ),
    )
