"""Mixed precision for the workers: float32 master weights and optimizer state, a lower compute dtype.

``model.dtype: bfloat16`` keeps the parameters, their gradients and AdamW's moments in float32 and
runs the matmuls in bfloat16: under ``torch.autocast`` on one rank and with DDP, through FSDP2's
``MixedPrecisionPolicy`` (parameters gathered in bfloat16, gradients reduced in float32) when
sharded. Log-softmax, log-probs, entropies and losses stay float32 (``lm_head.py``,
``common.response_log_probs``): bf16 keeps ~3 significant digits, enough to bias a PPO ratio.
Pure bfloat16 weights would lose updates smaller than 1/256 of a weight, which at RL learning rates
is most of them.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

import torch

__all__ = ["autocast", "compute_dtype"]


def compute_dtype(name: str, device: torch.device) -> torch.dtype:
    """The torch dtype ``model.dtype`` names, checked to run on ``device`` (a matmul and its
    backward under autocast), so an unsupported one fails at start rather than mid-run."""
    dtype = getattr(torch, name)
    if dtype == torch.float32:
        return dtype
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(
            f"model.dtype={name}: this GPU does not support bfloat16 "
            "(it needs compute capability 8.0+, e.g. A100, H100); use model.dtype=float32"
        )
    try:
        x = torch.ones(4, 4, device=device, requires_grad=True)
        with torch.autocast(device.type, dtype=dtype):
            y = x @ x
        y.float().sum().backward()
    except (RuntimeError, TypeError) as e:
        raise ValueError(
            f"model.dtype={name} cannot run on {device.type}: {str(e).splitlines()[0]}; use model.dtype=float32"
        ) from None
    if y.dtype != dtype:
        raise ValueError(
            f"model.dtype={name}: autocast on {device.type} computes in {y.dtype}, not {dtype}; use model.dtype=float32"
        )
    return dtype


def autocast(device: torch.device, dtype: torch.dtype, enabled: bool = True) -> ContextManager:
    """``torch.autocast`` to ``dtype`` on ``device``; a no-op for float32 or when not ``enabled``
    (FSDP2 casts through its policy instead)."""
    if dtype == torch.float32 or not enabled:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
