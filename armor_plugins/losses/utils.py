"""Masked tensor helpers shared by the advantage estimators and the losses.

Everything here is a pure function on (bs, response_length) tensors. Two habits make them safe
on real batches:

* Masking uses ``torch.where`` rather than ``values * mask``: a NaN or Inf sitting in a padded
  position (a garbage log-prob past EOS, say) would otherwise leak through ``0 * inf = nan``, in
  the forward pass and in the gradient.
* A reduction over no valid element returns 0, never ``0 / 0``.
"""

from __future__ import annotations

import torch

__all__ = [
    "LOG_RATIO_CLAMP",
    "as_bool_mask",
    "clamped_ratio",
    "compute_entropy_loss",
    "entropy_from_logits",
    "masked_max",
    "masked_mean",
    "masked_min",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "policy_ratio_metrics",
]

#: Log-ratios are clamped to +-20 before ``exp``: exp(20) ~ 4.9e8 is far outside any clip range,
#: so no clipping decision changes, while exp overflows float32 past ~88.7 (and float16 past ~11).
LOG_RATIO_CLAMP = 20.0


def as_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` (any dtype, 1/True = valid) as a bool tensor."""
    return mask if mask.dtype == torch.bool else mask != 0


def _upcast(x: torch.Tensor) -> torch.Tensor:
    # statistics of bf16/fp16 tensors lose too much precision; compute them in fp32 at least
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is set; ``values`` elsewhere are ignored even if NaN/Inf.

    :param values: (bs, T) or any shape broadcastable with ``mask``.
    :param dim: reduce this dimension only (None: everything, 0-d result).
    """
    m = as_bool_mask(mask)
    v = torch.where(m, values, torch.zeros((), dtype=values.dtype, device=values.device))
    return v.sum() if dim is None else v.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over valid positions; 0 where there is no valid position.

    :param values: (bs, T); :param mask: (bs, T); :returns: 0-d, or (bs,) for ``dim=-1``.
    """
    m = as_bool_mask(mask)
    count = m.sum() if dim is None else m.sum(dim=dim)
    return masked_sum(values, m, dim) / count.clamp(min=1).to(values.dtype)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over all valid positions (0-d); 0 when fewer than 2 are valid.

    ``unbiased`` applies Bessel's correction (divide by n - 1), like ``torch.var``.
    """
    m = as_bool_mask(mask)
    v = _upcast(values)
    n = m.sum()
    mean = masked_mean(v, m)
    sq = masked_sum((v - mean) ** 2, m)
    denom = (n - 1) if unbiased else n
    var = sq / denom.clamp(min=1).to(v.dtype)
    return torch.where(n >= 2, var, torch.zeros_like(var)).to(values.dtype)


def masked_max(values: torch.Tensor, mask: torch.Tensor, empty: float = 0.0) -> torch.Tensor:
    """Largest valid value (0-d); ``empty`` when nothing is valid."""
    m = as_bool_mask(mask)
    if not bool(m.any()):
        return torch.tensor(empty, dtype=values.dtype, device=values.device)
    return values[m].max()


def masked_min(values: torch.Tensor, mask: torch.Tensor, empty: float = 0.0) -> torch.Tensor:
    """Smallest valid value (0-d); ``empty`` when nothing is valid."""
    m = as_bool_mask(mask)
    if not bool(m.any()):
        return torch.tensor(empty, dtype=values.dtype, device=values.device)
    return values[m].min()


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Whiten ``values`` with the mean and (unbiased) variance of its valid positions.

    ``(x - mean) / sqrt(var + eps)`` at valid positions (without ``- mean`` if not
    ``shift_mean``), 0 elsewhere. When all valid values are equal the result is exactly 0: float
    rounding of the mean would otherwise turn "no signal" into ``1e-7 / sqrt(eps)`` noise.

    :param values: (bs, T); :param mask: (bs, T); :returns: (bs, T), same dtype as ``values``.
    """
    m = as_bool_mask(mask)
    v = _upcast(values)
    zero = torch.zeros((), dtype=v.dtype, device=v.device)
    if not bool(m.any()):
        return torch.zeros_like(values)
    if shift_mean and masked_max(v, m) == masked_min(v, m):
        return torch.zeros_like(values)
    # work in units of the largest magnitude: the sum and the squares of values near 1e20 would
    # overflow float32. (x - mean) / sqrt(var + eps) == (x/s - mean/s) / sqrt(var/s^2 + eps/s^2).
    scale = masked_max(v.abs(), m).clamp(min=1.0)
    vs = torch.where(m, v / scale, zero)
    var_s = masked_var(vs, m)
    centred = vs - masked_mean(vs, m) if shift_mean else vs
    inv_std = torch.rsqrt((var_s + eps / (scale * scale)).clamp(min=torch.finfo(v.dtype).tiny))
    return torch.where(m, centred * inv_std, zero).to(values.dtype)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution softmax(logits) over the last dimension.

    ``H = logsumexp(z) - sum softmax(z) * z``: no ``log(softmax)`` of tiny probabilities, so it is
    finite for any finite logits.

    :param logits: (bs, T, vocab); :returns: (bs, T) in the logits' dtype (computed in fp32+).
    """
    z = _upcast(logits)
    p = torch.softmax(z, dim=-1)
    return (torch.logsumexp(z, dim=-1) - (p * z).sum(dim=-1)).to(logits.dtype)


def compute_entropy_loss(entropy: torch.Tensor, response_mask: torch.Tensor, entropy_coeff: float) -> torch.Tensor:
    """The entropy bonus as a per-token loss term: ``-entropy_coeff * entropy``, 0 outside the mask.

    Returned unaggregated so the worker adds it to the policy loss matrix and aggregates the sum
    with the configured mode (one aggregation, so micro-batching stays exact).

    :param entropy: (bs, T), e.g. from :func:`entropy_from_logits`; :returns: (bs, T).
    """
    m = as_bool_mask(response_mask)
    return torch.where(m, -entropy_coeff * entropy, torch.zeros((), dtype=entropy.dtype, device=entropy.device))


def clamped_ratio(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, response_mask: torch.Tensor, clamp: float = LOG_RATIO_CLAMP
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``log(pi / pi_old)`` clamped to ``+-clamp`` and its ``exp``; both 0/1 outside the mask.

    Computed in fp32 at least. Beyond the clamp the gradient is 0, which is what the PPO clip
    would give anyway for any sensible clip range.

    :returns: ``(log_ratio (bs, T), ratio (bs, T))``.
    """
    m = as_bool_mask(response_mask)
    lp, old = _upcast(log_prob), _upcast(old_log_prob).detach()
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
