"""GPG: the plain policy gradient, no ratio and no clip (Chu et al. 2025, "GPG: A Simple and Strong
Reinforcement Learning Baseline for Model Reasoning", arXiv:2504.02546).

Per token::

    loss = -A * log pi(y_t)            gradient: -A * grad log pi(y_t)

It is REINFORCE with whatever advantage the estimator gives; the GPG paper pairs it with a
group-normalised advantage and a batch correction, which belong to the advantage estimator,
not to this loss. Without a ratio nothing corrects for off-policy data: the gradient is unbiased
only on the first update of a batch (one mini-batch, one epoch); later updates see stale samples
and nothing bounds the step. The ratio metrics are still reported (computed from
``old_log_prob``, no gradient), so the ``importance_ratio`` guard can watch the drift.

Matches ``compute_policy_loss_gpg`` of verl 0.9.1 (``verl/trainer/ppo/core_algos.py``): the same
per-token value and gradient. verl returns no metrics; we return the ones every ARMOR loss
reports (``pg_clipfrac`` 0: nothing is clipped).
"""

from __future__ import annotations

from typing import Any

import torch

from armor_core import PolicyLoss, hookimpl
from armor_core.hookspecs import RegisterPolicyLoss
from armor_core.ops.masked import upcast
from armor_plugins.losses.utils import masked_inputs, unclipped_metrics

__all__ = ["compute_policy_loss_gpg"]


def compute_policy_loss_gpg(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Per-token policy-gradient loss ``-A * log pi``.

    :param log_prob: (bs, T) current log-probs (differentiable).
    :param old_log_prob: (bs, T) sampling-policy log-probs; used for metrics only.
    :param advantages: (bs, T); :param response_mask: (bs, T).
    :returns: ``(loss_mat (bs, T), metrics)``, 0 outside the mask. Metrics (detached, valid
        tokens): ``pg_clipfrac`` and ``pg_clipfrac_lower`` (0), ``ppo_kl``, ``ppo_kl_k3``,
        ``ratio_min/max/mean``.
    """
    lp = upcast(log_prob)
    m, zero, adv = masked_inputs(advantages, response_mask, like=lp)
    lp = torch.where(m, lp, zero)  # a NaN in padding must not reach the gradient
    loss_mat = torch.where(m, -adv * lp, zero)

    return loss_mat, unclipped_metrics(log_prob, old_log_prob, m, zero)


@hookimpl
def armor_register_policy_losses(register: RegisterPolicyLoss) -> None:
    register(
        "gpg",
        PolicyLoss(fn=compute_policy_loss_gpg, description="GPG: plain policy gradient -A log pi, no ratio or clip"),
    )
