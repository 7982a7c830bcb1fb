"""What the policy losses share: their masked inputs, the clamped probability ratio, the ratio metrics
every loss reports, and the entropy of a categorical distribution.

Pure functions on (bs, response_length) tensors; masking follows ``armor_core.ops.masked`` (a NaN or
Inf in a padded position never leaks into a result), whose reductions they use.
"""

from __future__ import annotations

import torch

from armor_core.ops.kl import LOG_RATIO_CLAMP
from armor_core.ops.masked import as_bool_mask, masked_max, masked_mean, masked_min, upcast

__all__ = [
    "LOG_RATIO_CLAMP",
    "clamped_ratio",
    "entropy_from_logits",
    "masked_inputs",
    "policy_ratio_metrics",
    "unclipped_metrics",
]

# LOG_RATIO_CLAMP (+-20 before ``exp``) is defined with the KL estimators, which clamp the same way


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution softmax(logits) over the last dimension.

    ``H = logsumexp(z) - sum softmax(z) * z``: no ``log(softmax)`` of tiny probabilities, so it is
    finite for any finite logits.

    :param logits: (bs, T, vocab); :returns: (bs, T) in the logits' dtype (computed in fp32+).
    """
    z = upcast(logits)
    p = torch.softmax(z, dim=-1)
    return (torch.logsumexp(z, dim=-1) - (p * z).sum(dim=-1)).to(logits.dtype)


def masked_inputs(
    advantages: torch.Tensor, response_mask: torch.Tensor, like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every policy loss's preamble: the mask as bool, a 0-d zero and the advantages, detached and 0 outside the
    mask, in ``like``'s dtype and device (the ratio's for a ratio-based loss, the upcast log-probs' otherwise).

    :param advantages: (bs, T); :param response_mask: (bs, T), any dtype.
    :returns: ``(mask (bs, T) bool, zero (0-d), advantages (bs, T))``.
    """
    m = as_bool_mask(response_mask)
    zero = torch.zeros((), dtype=like.dtype, device=like.device)
    return m, zero, torch.where(m, advantages.detach().to(like.dtype), zero)


def clamped_ratio(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, response_mask: torch.Tensor, clamp: float = LOG_RATIO_CLAMP
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``log(pi / pi_old)`` clamped to ``+-clamp`` and its ``exp``; both 0/1 outside the mask.

    Computed in fp32 at least. Beyond the clamp the gradient is 0, which is what the PPO clip
    would give anyway for any sensible clip range.

    :returns: ``(log_ratio (bs, T), ratio (bs, T))``.
    """
    m = as_bool_mask(response_mask)
    lp, old = upcast(log_prob), upcast(old_log_prob).detach()
    zero = torch.zeros((), dtype=lp.dtype, device=lp.device)
    log_ratio = torch.where(m, (lp - old).clamp(-clamp, clamp), zero)
    return log_ratio, torch.exp(log_ratio)


def policy_ratio_metrics(
    log_ratio: torch.Tensor, ratio: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Metrics every policy loss reports, over valid tokens, detached 0-d tensors.

    ``ppo_kl``: mean of ``log pi_old - log pi`` (the k1 estimate of KL(pi_old || pi) on samples
    from pi_old, the same quantity verl logs); ``ppo_kl_k3``: mean of ``r - 1 - log r``, the
    non-negative, lower-variance estimate of the same KL (Schulman, "Approximating KL
    divergence", 2020); ``ratio_min/max/mean``. With no valid token: KLs 0, ratios 1.
    """
    m = as_bool_mask(response_mask)
    with torch.no_grad():
        lr, r = log_ratio.detach(), ratio.detach()
        has = bool(m.any())
        return {
            "ppo_kl": masked_mean(-lr, m),
            "ppo_kl_k3": masked_mean(r - 1 - lr, m),
            "ratio_min": masked_min(r, m, empty=1.0),
            "ratio_max": masked_max(r, m, empty=1.0),
            "ratio_mean": masked_mean(r, m) if has else torch.ones((), dtype=r.dtype, device=r.device),
        }


def unclipped_metrics(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, response_mask: torch.Tensor, zero: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The metrics of a loss with no ratio in it and nothing to clip (``gpg``, ``dro``): ``pg_clipfrac`` and
    ``pg_clipfrac_lower`` 0 (copies of ``zero``), then ``policy_ratio_metrics`` of the clamped ratio, computed
    from ``log_prob`` detached."""
    log_ratio, ratio = clamped_ratio(log_prob.detach(), old_log_prob, response_mask, LOG_RATIO_CLAMP)
    metrics = {"pg_clipfrac": zero.clone(), "pg_clipfrac_lower": zero.clone()}
    metrics.update(policy_ratio_metrics(log_ratio, ratio, response_mask))
    return metrics
