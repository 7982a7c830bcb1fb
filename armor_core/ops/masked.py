"""Masked reductions over (bs, response_length) tensors, for the core and for plugin authors.

Two habits make them safe on real batches:

* Masking uses ``torch.where`` rather than ``values * mask``: a NaN or Inf sitting in a padded
  position (a garbage log-prob past EOS, say) would otherwise leak through ``0 * inf = nan``, in
  the forward pass and in the gradient.
* A reduction over no valid element returns 0 (or the ``empty`` value asked for), never ``0 / 0``.

Statistics of fp16/bf16 tensors (variance, whitening) are computed in fp32 at least.
"""

from __future__ import annotations

import torch

__all__ = [
    "as_bool_mask",
    "masked_max",
    "masked_mean",
    "masked_min",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "upcast",
]


def as_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` (any dtype, 1/True = valid) as a bool tensor."""
    return mask if mask.dtype == torch.bool else mask != 0


def upcast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in fp32 if it is fp16/bf16 (their statistics lose too much precision), else unchanged."""
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
    v = upcast(values)
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
    v = upcast(values)
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
