"""Masked reductions the core needs (the plugins have a fuller set in ``armor_plugins/losses/utils.py``)."""

from __future__ import annotations

import torch

__all__ = ["masked_mean"]


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over ``mask``'s valid positions (0 where there is none); ``values``
    elsewhere are ignored even if NaN or infinite.

    :param mask: bool or 0/1, broadcastable with ``values``; :param dim: reduce this dimension only.
    """
    m = mask if mask.dtype == torch.bool else mask != 0
    v = torch.where(m, values, torch.zeros((), dtype=values.dtype, device=values.device))
    count = m.sum() if dim is None else m.sum(dim=dim)
    return (v.sum() if dim is None else v.sum(dim=dim)) / count.clamp(min=1).to(values.dtype)
