"""The KL loss the actor adds to the policy loss (``actor.use_kl_loss``, GRPO style), and how a KL
estimator is named: ``kl_estimator_fn`` is shared with the driver's in-reward penalty
(``loop/kl_penalty.py``). The estimators are ``kl_estimator`` plugins; the built-in ones and ``masked_kl``,
how both apply one, are ``armor_core.ops.kl``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from armor_core.ops.kl import masked_kl
from armor_core.ops.masked import masked_mean

if TYPE_CHECKING:
    from armor_core.interfaces import KLEstimator

__all__ = ["compute_kl_loss", "kl_estimator_fn"]


def kl_estimator_fn(
    estimator: str | KLEstimator | Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A ``KLEstimator``'s function, a registered estimator's by name, or a function as it is."""
    from armor_core.interfaces import KLEstimator

    if isinstance(estimator, KLEstimator):
        return estimator.fn
    if isinstance(estimator, str):
        from armor_core.plugins import get_plugin

        return get_plugin("kl_estimator", estimator).fn
    if callable(estimator):
        return estimator
    raise TypeError(
        "KL estimator must be a registered name (k1, k3, ...), a KLEstimator or a function; "
        f"got {type(estimator).__name__}"
    )


def compute_kl_loss(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    estimator: str | KLEstimator | Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = "k3",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """KL as a loss term (GRPO style): ``kl_coef * kl`` per token, 0 outside the mask. The actor
    calls it with ``kl_coef=1`` and weighs the aggregated term by ``actor.kl_loss_coef``.

    Unaggregated, so the caller aggregates it as it does the policy loss
    (``actor.loss_agg_mode``). Padded positions are zeroed before the estimator (``masked_kl``).

    :param log_prob: (bs, T) differentiable; :param ref_log_prob: (bs, T) reference, no gradient.
    :param estimator: a name (``actor.kl_loss_type``), a ``KLEstimator`` or a function.
    :returns: ``(loss_mat (bs, T), {"kl_loss": mean KL over valid tokens (detached)})``.
    """
    m = response_mask.bool()
    kl = masked_kl(kl_estimator_fn(estimator), log_prob, ref_log_prob, m)
    loss_mat = torch.where(m, kl_coef * kl, torch.zeros((), dtype=kl.dtype, device=kl.device))
    return loss_mat, {"kl_loss": masked_mean(kl.detach(), m)}
