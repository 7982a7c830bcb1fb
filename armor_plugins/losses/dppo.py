"""DPPO: a trust region on the policy divergence, not on the ratio (Qi et al. 2026, "Rethinking the
Trust Region in LLM Reinforcement Learning", arXiv:2602.04879).

PPO's ratio clip over-constrains rare tokens (a probability moving from 1e-4 to 2e-4 doubles the
ratio) and under-constrains likely ones (0.9 -> 0.5 is only a ratio of 0.56). DPPO (Divergence
Proximal Policy Optimization) instead drops a token's gradient once the policy has moved the
sampled token's probability ``p`` away from ``p_old`` by more than a divergence threshold, in
the direction its advantage pushes. The "binary" approximations look only at the two-outcome
distribution {sampled token, everything else}:

    dppo_tv:  keep = (p - p_old <= eps_high)  if A > 0  else  (p - p_old >= -eps_low)
    dppo_kl:  d = KL(Bern(p_old) || Bern(p));
              keep = (d <= eps_high or p <= p_old)  if A > 0  else  (d <= eps_low or p >= p_old)

and the per-token loss on kept tokens is the truncated-IS policy gradient (no ratio clip)::

    gradient = -sg(min(r, c)) * A * grad log pi(y_t) * keep

As in ``cispo``, we write the loss as ``-sg(w) * A * exp(log pi - sg(log pi)) * keep`` with
``w = min(r, c)``: the value is ``-w A`` (comparable with PPO's per-token surrogate) and the
gradient is the one above. The thresholds are ``actor.clip_ratio_low/high``, as in verl, so a verl
config carries over, but here they bound a divergence, not a ratio. The truncation ``c`` is
``actor.clip_ratio_c`` (ARMOR's default 3); the DPPO authors advise a large one (their section
5.4), e.g. 20, since truncation biases the gradient; None disables it.

Matches ``compute_policy_loss_dppo_tv`` and ``compute_policy_loss_dppo_kl`` of verl 0.9.1
(``verl/trainer/ppo/core_algos.py``) in gradient and in which tokens are kept. Departures: verl's
loss value is ``-w A log pi`` (same gradient; we keep the value comparable across losses, as
``cispo`` does); verl's ``pg_clipfrac`` counts every dropped token and its ``pg_clipfrac_lower``
counts truncated ones; ours split dropped tokens by side as ``ppo_clip`` does (A > 0 /
A < 0) and report truncation as ``pg_truncfrac``. Log-probs above 0 (not a probability) are
read as 0 when computing ``p``, so the divergence stays finite on any input.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from armor_core import PolicyLoss, hookimpl
from armor_core.hookspecs import RegisterPolicyLoss
from armor_core.ops.masked import masked_mean, upcast
from armor_plugins.losses.utils import LOG_RATIO_CLAMP, clamped_ratio, masked_inputs, policy_ratio_metrics

__all__ = ["binary_kl", "compute_policy_loss_dppo_kl", "compute_policy_loss_dppo_tv"]

#: 1 - p rounds to 0 in fp32 for p within ~6e-8 of 1; this keeps log(1 - p) finite. verl adds the
#: same 1e-8, so the keep masks agree with verl's even for near-certain tokens.
_BERNOULLI_EPS = 1e-8


def binary_kl(log_p_old: torch.Tensor, log_p: torch.Tensor) -> torch.Tensor:
    """``KL(Bern(p_old) || Bern(p))`` elementwise from log-probabilities (any shape, no gradient needed)."""
    p_old, p = torch.exp(log_p_old), torch.exp(log_p)
    # (1 - p) first, then + eps: in fp32, eps - p would lose the 1e-8 next to p = 1
    rest = torch.log((1.0 - p_old) + _BERNOULLI_EPS) - torch.log((1.0 - p) + _BERNOULLI_EPS)
    return p_old * (log_p_old - log_p) + (1.0 - p_old) * rest


def _keep_tv(
    log_p: torch.Tensor, log_p_old: torch.Tensor, adv: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    diff = torch.exp(log_p) - torch.exp(log_p_old)
    return torch.where(adv > 0, diff <= high, diff >= -low), diff.abs()


def _keep_kl(
    log_p: torch.Tensor, log_p_old: torch.Tensor, adv: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    d = binary_kl(log_p_old, log_p)
    p, p_old = torch.exp(log_p), torch.exp(log_p_old)
    rose, fell = p >= p_old, p <= p_old
    return torch.where(adv > 0, (d <= high) | fell, (d <= low) | rose), d


def _dppo_loss(
    name: str,
    keep_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None,
    log_ratio_clamp: float,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The loss both variants share; ``keep_fn(log_p, log_p_old, adv, low, high) -> (keep, divergence)``."""
    if clip_ratio_low < 0 or clip_ratio_high < 0:
        raise ValueError(f"{name}: clip_ratio_low={clip_ratio_low}, clip_ratio_high={clip_ratio_high} must be >= 0")
    if clip_ratio_c is not None and not clip_ratio_c > 0:
        raise ValueError(f"{name}: clip_ratio_c={clip_ratio_c} must be > 0 (actor.clip_ratio_c), or None")
    log_ratio, ratio = clamped_ratio(log_prob, old_log_prob, response_mask, log_ratio_clamp)
    m, zero, adv = masked_inputs(advantages, response_mask, like=ratio)
    lp = torch.where(m, upcast(log_prob), zero)  # a NaN in padding must not reach the gradient

    with torch.no_grad():
        log_p = lp.detach().clamp(max=0.0)
        log_p_old = torch.where(m, upcast(old_log_prob).detach(), zero).clamp(max=0.0)
        keep, divergence = keep_fn(log_p, log_p_old, adv, clip_ratio_low, clip_ratio_high)
        keep = keep & m
        weight = ratio.detach() if clip_ratio_c is None else ratio.detach().clamp(max=clip_ratio_c)
    loss = -weight * adv * torch.exp(lp - lp.detach())
    loss_mat = torch.where(keep, loss, zero)

    with torch.no_grad():
        truncated = keep & (ratio > clip_ratio_c) if clip_ratio_c is not None else torch.zeros_like(m)
        metrics: dict[str, Any] = {
            "pg_clipfrac": masked_mean(((adv > 0) & ~keep).to(ratio.dtype), m),
            "pg_clipfrac_lower": masked_mean(((adv < 0) & ~keep).to(ratio.dtype), m),
            "pg_truncfrac": masked_mean(truncated.to(ratio.dtype), m),
            "dppo_divergence_mean": masked_mean(divergence, m),
        }
    metrics.update(policy_ratio_metrics(log_ratio, ratio, m))
    return loss_mat, metrics


def compute_policy_loss_dppo_tv(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = 20.0,
    log_ratio_clamp: float = LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token DPPO-Binary-TV loss: truncated-IS policy gradient on tokens whose ``p - p_old`` is in bounds.

    :param log_prob: (bs, T) current log-probs (differentiable).
    :param old_log_prob: (bs, T) sampling-policy log-probs (no gradient).
    :param advantages: (bs, T); :param response_mask: (bs, T).
    :param clip_ratio_low: a token with ``A <= 0`` is dropped once ``p - p_old < -clip_ratio_low``.
    :param clip_ratio_high: a token with ``A > 0`` is dropped once ``p - p_old > clip_ratio_high``.
    :param clip_ratio_c: the IS weight is ``min(r, clip_ratio_c)``; None: no truncation.
    :param log_ratio_clamp: ``log r`` is clamped to +-this before exp.
    :returns: ``(loss_mat (bs, T), metrics)``, 0 outside the mask and on dropped tokens. Metrics
        (detached, valid tokens): ``pg_clipfrac`` (A > 0, dropped), ``pg_clipfrac_lower`` (A < 0,
        dropped), ``pg_truncfrac`` (kept, r > c), ``dppo_divergence_mean`` (mean ``|p - p_old|``),
        ``ppo_kl``, ``ppo_kl_k3``, ``ratio_min/max/mean``.
    """
    return _dppo_loss(
        "dppo_tv",
        _keep_tv,
        log_prob,
        old_log_prob,
        advantages,
        response_mask,
        clip_ratio_low,
        clip_ratio_high,
        clip_ratio_c,
        log_ratio_clamp,
    )


def compute_policy_loss_dppo_kl(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = 20.0,
    log_ratio_clamp: float = LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token DPPO-Binary-KL loss: truncated-IS policy gradient on tokens whose binary KL is in bounds.

    A token with ``A > 0`` is dropped when ``p`` rose and ``KL(Bern(p_old) || Bern(p)) >
    clip_ratio_high``; one with ``A <= 0`` when ``p`` fell and the KL exceeds ``clip_ratio_low``.
    Parameters, shapes and metrics as :func:`compute_policy_loss_dppo_tv`, with
    ``dppo_divergence_mean`` the mean binary KL.
    """
    return _dppo_loss(
        "dppo_kl",
        _keep_kl,
        log_prob,
        old_log_prob,
        advantages,
        response_mask,
        clip_ratio_low,
        clip_ratio_high,
        clip_ratio_c,
        log_ratio_clamp,
    )


@hookimpl
def armor_register_policy_losses(register: RegisterPolicyLoss) -> None:
    register(
        "dppo_tv",
        PolicyLoss(
            fn=compute_policy_loss_dppo_tv,
            description="DPPO-Binary-TV: drop tokens whose probability moved past a TV bound; truncated IS",
        ),
    )
    register(
        "dppo_kl",
        PolicyLoss(
            fn=compute_policy_loss_dppo_kl,
            description="DPPO-Binary-KL: drop tokens whose binary KL moved past a bound; truncated IS",
        ),
    )
