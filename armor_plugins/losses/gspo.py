"""GSPO: clipping on the sequence-level importance ratio (Zheng et al. 2025, Qwen team).

The sequence ratio is the geometric mean of the token ratios of a response,
``s_i = exp(mean_t log(pi(y_it) / pi_old(y_it)))``. The paper's GSPO-token variant gives
every token the ratio ::

    s_it = sg[s_i] * pi(y_it) / sg[pi(y_it)]          (sg = stop-gradient)

whose *value* is ``s_i`` and whose gradient is ``s_i * grad log pi(y_it)``. The per-token loss is
the PPO clipped surrogate on ``s_it`` (no dual-clip in the paper).

How it composes with aggregation: the paper's objective averages over each sequence's tokens
and then over sequences, i.e. ``actor.loss_agg_mode: seq-mean-token-mean``. With that mode and
a per-sequence advantage, the token form is *exactly* GSPO: the value is
``mean_i min(s_i A_i, clip(s_i) A_i)`` and the gradient is
``A_i s_i mean_t grad log pi(y_it) = A_i grad s_i`` for each unclipped sequence. Under
``token-mean`` each sequence is instead weighted by its length. The clip decision is per
sequence (every token of a sequence shares ``s_i``), so the clip fractions below are fractions
of tokens in clipped sequences. The paper's clip range is far narrower than PPO's (they report
eps_low=3e-4, eps_high=4e-4): set ``actor.clip_ratio_low/high`` accordingly.

Long function: ``compute_policy_loss_gspo``, a third of it the docstring (shapes, metrics); the rest is one formula.
"""

from __future__ import annotations

from typing import Any

import torch

from armor_core import PolicyLoss, hookimpl
from armor_core.hookspecs import RegisterPolicyLoss
from armor_core.ops.masked import masked_mean, masked_sum, upcast
from armor_plugins.losses.utils import LOG_RATIO_CLAMP, masked_inputs, policy_ratio_metrics

__all__ = ["compute_policy_loss_gspo"]


def compute_policy_loss_gspo(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    log_ratio_clamp: float = LOG_RATIO_CLAMP,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token GSPO-token loss: the clipped surrogate on the sequence ratio, token gradients.

    :param log_prob: (bs, T) current log-probs (differentiable).
    :param old_log_prob: (bs, T) sampling-policy log-probs (no gradient).
    :param advantages: (bs, T); usually constant over a sequence (GRPO-style).
    :param response_mask: (bs, T).
    :param clip_ratio_low, clip_ratio_high: bounds on the sequence ratio.
    :param log_ratio_clamp: the sequence log-ratio is clamped to +-this before exp. The
        gradient passes through ``log_prob - sg(log_prob)``, not through the clamp, so it is
        ``s_i * grad log pi`` with ``s_i <= exp(clamp)``: finite.
    :returns: ``(loss_mat (bs, T), metrics)``, ``loss_mat`` 0 outside the mask. Metrics
        (detached, over valid tokens): ``pg_clipfrac`` (A > 0, s > 1 + eps_high),
        ``pg_clipfrac_lower`` (A < 0, s < 1 - eps_low), ``ppo_kl`` and ``ppo_kl_k3`` from the
        token ratios, ``ratio_min/max/mean`` of the sequence ratio, and ``seq_ratio_mean``
        (mean of s_i over sequences with a valid token).
    """
    lp = upcast(log_prob)
    m, zero, adv = masked_inputs(advantages, response_mask, like=lp)
    lp = torch.where(m, lp, zero)  # sanitise padding: a NaN there must not reach the gradient
    old = torch.where(m, old_log_prob.detach().to(lp.dtype), zero)

    token_log_ratio = (lp - old).detach()
    lengths = m.sum(dim=-1).clamp(min=1).to(lp.dtype)
    seq_log_ratio = (masked_sum(token_log_ratio, m, dim=-1) / lengths).clamp(-log_ratio_clamp, log_ratio_clamp)
    # value: the sequence log-ratio; gradient: d log pi(y_it), the stop-gradient construction
    log_s = seq_log_ratio.unsqueeze(-1) + lp - lp.detach()
    s = torch.exp(log_s)

    low, high = 1.0 - clip_ratio_low, 1.0 + clip_ratio_high
    loss = torch.maximum(-adv * s, -adv * s.clamp(low, high))
    loss_mat = torch.where(m, loss, zero)

    with torch.no_grad():
        s_val = s.detach()
        has_token = m.any(dim=-1)
        metrics: dict[str, Any] = {
            "pg_clipfrac": masked_mean(((adv > 0) & (s_val > high)).to(lp.dtype), m),
            "pg_clipfrac_lower": masked_mean(((adv < 0) & (s_val < low)).to(lp.dtype), m),
            "seq_ratio_mean": masked_mean(torch.exp(seq_log_ratio), has_token),
        }
        token_ratio_metrics = policy_ratio_metrics(
            token_log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp),
            torch.exp(token_log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)),
            m,
        )
        seq_ratio_metrics = policy_ratio_metrics(log_s.detach(), s_val, m)
    metrics["ppo_kl"] = token_ratio_metrics["ppo_kl"]
    metrics["ppo_kl_k3"] = token_ratio_metrics["ppo_kl_k3"]
    for key in ("ratio_min", "ratio_max", "ratio_mean"):
        metrics[key] = seq_ratio_metrics[key]
    return loss_mat, metrics


@hookimpl
def armor_register_policy_losses(register: RegisterPolicyLoss) -> None:
    register(
        "gspo",
        PolicyLoss(
            fn=compute_policy_loss_gspo,
            description="GSPO-token: clipped sequence-level ratio with token-level gradients",
        ),
    )
