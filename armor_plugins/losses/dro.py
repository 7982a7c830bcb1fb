"""DRO: the policy gradient with a quadratic proximal penalty instead of a clip (Richemond et al. 2024,
"Offline regularised reinforcement learning for large language models alignment", arXiv:2405.19107;
verl's ``dro`` policy loss).

Per token, with ``d = log pi(y_t) - log pi_old(y_t)``::

    loss = -(A * log pi(y_t) - beta / 2 * d**2)      gradient: -(A - beta * d) * grad log pi(y_t)

At the sampling policy (``d = 0``) the gradient is the plain policy gradient; as the policy moves
away, the penalty pulls it back in proportion to the distance, smoothly, where a clip cuts the
gradient off at a threshold. ``beta`` (``actor.policy_loss_kwargs.beta``, > 0; 0.1 by default, a
value to tune: a larger one keeps updates closer to the sampling policy) sets how hard.

Same per-token value and gradient as verl 0.9.1's ``dro`` loss (``dro_beta`` there). The log-ratio
in the penalty is clamped to +-20 like every ARMOR ratio (the square of an unbounded log-ratio from a
broken batch would swamp the loss); within that range the value is verl's. Metrics are the ones
every ARMOR loss reports (``pg_clipfrac`` 0: nothing is clipped).
"""

from __future__ import annotations

from typing import Any

import torch

from armor_core import PolicyLoss, hookimpl
from armor_core.hookspecs import RegisterPolicyLoss
from armor_core.ops.masked import upcast
from armor_plugins.losses.utils import LOG_RATIO_CLAMP, masked_inputs, unclipped_metrics

__all__ = ["compute_policy_loss_dro"]


def compute_policy_loss_dro(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    beta: float = 0.1,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token DRO loss ``-(A log pi - beta/2 (log pi - log pi_old)^2)``.

    :param log_prob: (bs, T) current log-probs (differentiable).
    :param old_log_prob: (bs, T) sampling-policy log-probs.
    :param advantages: (bs, T); :param response_mask: (bs, T).
    :param beta: the penalty's weight, > 0.
    :returns: ``(loss_mat (bs, T), metrics)``, 0 outside the mask; the ratio metrics of every loss.
    """
    if not beta > 0:
        raise ValueError(f"actor.policy_loss_kwargs.beta={beta}: dro needs a penalty weight above 0 (e.g. 0.1)")
    lp = upcast(log_prob)
    m, zero, adv = masked_inputs(advantages, response_mask, like=lp)
    lp = torch.where(m, lp, zero)  # a NaN in padding must not reach the gradient
    old = torch.where(m, old_log_prob.detach().to(lp.dtype), zero)
    d = (lp - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    loss_mat = torch.where(m, -(adv * lp - 0.5 * beta * d * d), zero)

    return loss_mat, unclipped_metrics(log_prob, old_log_prob, m, zero)


@hookimpl
def armor_register_policy_losses(register: RegisterPolicyLoss) -> None:
    register(
        "dro",
        PolicyLoss(
            fn=compute_policy_loss_dro,
            description="DRO: policy gradient with a quadratic penalty on the log-ratio instead of a clip",
        ),
    )
