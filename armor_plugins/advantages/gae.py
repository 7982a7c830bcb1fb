"""GAE: generalised advantage estimation with a learned critic (Schulman et al. 2016), for PPO.

Backwards over the tokens of each response::

    delta_t = r_t + gamma V_next - V_t
    A_t     = delta_t + gamma lam A_next          returns_t = A_t + V_t

where ``next`` is the next *valid* token (0 past the last one: the response ends the episode).
Positions outside the response mask (padding, or tool output inside a multi-turn response) are
skipped: they carry neither a value nor a TD error, and the recursion runs through them
unchanged instead of being cut. The returns, the critic's targets, are computed from the raw
advantages; only then are the advantages whitened over every valid token of the batch.

Registered with ``requires_critic=True`` so the trainer builds a critic; it never asks for the
name "gae".
"""

from __future__ import annotations

from typing import Any

import torch

from armor_core import AdvantageEstimator, hookimpl
from armor_core.hookspecs import RegisterAdvantageEstimator
from armor_core.ops.masked import as_bool_mask, masked_whiten

__all__ = ["compute_gae_advantage"]


def compute_gae_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any = None,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages (whitened) and returns (unwhitened).

    :param token_level_rewards: (bs, T); rewards on masked positions are ignored.
    :param response_mask: (bs, T).
    :param index: (bs,) group ids; unused (every estimator receives it).
    :param values: (bs, T) critic values at rollout time, required.
    :param gamma: ``algorithm.gamma``; :param lam: ``algorithm.lam``.
    :returns: ``(advantages, returns)``, both (bs, T), 0 outside the mask.
    """
    if values is None:
        raise ValueError(
            "gae needs the critic's values (bs, response_length); the trainer passes them because gae is "
            "registered with requires_critic=True"
        )
    if values.shape != token_level_rewards.shape:
        raise ValueError(
            f"gae: values has shape {tuple(values.shape)} but token_level_rewards has "
            f"{tuple(token_level_rewards.shape)}; both must be (bs, response_length)"
        )
    m = as_bool_mask(response_mask)
    dtype = torch.float32 if token_level_rewards.dtype in (torch.float16, torch.bfloat16) else token_level_rewards.dtype
    zero = torch.zeros((), dtype=dtype, device=token_level_rewards.device)
    r = torch.where(m, token_level_rewards.to(dtype), zero)
    v = torch.where(m, values.detach().to(dtype), zero)

    bs, T = r.shape
    adv = torch.zeros_like(r)
    next_value = torch.zeros(bs, dtype=dtype, device=r.device)
    next_adv = torch.zeros(bs, dtype=dtype, device=r.device)
    for t in reversed(range(T)):
        valid = m[:, t]
        delta = r[:, t] + gamma * next_value - v[:, t]
        adv_t = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(valid, adv_t, zero)
        next_value = torch.where(valid, v[:, t], next_value)
        next_adv = torch.where(valid, adv_t, next_adv)
    returns = torch.where(m, adv + v, zero)
    advantages = masked_whiten(adv, m)
    return advantages.to(token_level_rewards.dtype), returns.to(token_level_rewards.dtype)


@hookimpl
def armor_register_advantage_estimators(register: RegisterAdvantageEstimator) -> None:
    register(
        "gae",
        AdvantageEstimator(
            fn=compute_gae_advantage, requires_critic=True, description="GAE with a critic (PPO); whitened advantages"
        ),
    )
