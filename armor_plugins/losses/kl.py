"""KL(pi || pi_ref) estimators. (The KL loss term, the in-reward penalty and its controllers are
the core's: ``armor_core/loop/kl_penalty.py``.)

Samples come from pi, so with ``x = log pi(y) - log pi_ref(y)`` per token (Schulman,
"Approximating KL divergence", 2020):

=======  ==============================  =============================================
name     per-token value                 note
=======  ==============================  =============================================
``k1``   ``x``                           unbiased, high variance, can be negative
``k2``   ``x^2 / 2``                     biased, low variance; its gradient is right
``k3``   ``exp(-x) - 1 + x``             unbiased, low variance, >= 0 (GRPO's KL loss)
``abs``  ``|x|``                         biased
``k1+``  value of k1, gradient of k2     straight-through
``k3+``  value of k3, gradient of k2     straight-through
``abs+`` value of abs, gradient of k2    straight-through
=======  ==============================  =============================================

Why the ``+`` variants: as a *loss*, what matters is the gradient. Differentiating k1 or k3
through the samples only (the sampling distribution is held fixed, as in every LLM trainer)
gives a gradient whose expectation is 0 for k1 (``E_pi[grad log pi] = 0``) and the gradient of
KL(pi_ref || pi), the other direction, for k3; while ``grad k2 = x grad log pi`` is, in
expectation, the score-function gradient of KL(pi || pi_ref) itself (Tang & Munos 2025, "On a few
pitfalls in KL divergence gradient estimation for RL"). ``k1+``/``k3+`` report the familiar
k1/k3 values while optimising with the gradient of k2: ``value + (k2 - sg(k2))``. ``abs+`` does the
same for ``|x|`` (verl's rule for a ``+`` suffix: any estimator's value, k2's gradient; ``k2+`` would
be k2 itself, so it is not registered).

k3 exponentiates ``-x``, so a token the policy has made far less likely than the reference
(``x = -30``) would weigh ``exp(30) ~ 1e13`` in the loss. Its value is bounded to ``[0, 10]``
(``KL_BOUND``, as verl bounds it): a token past the bound adds 10 and no gradient, so a few such
tokens cannot swamp the loss of a whole batch. ``k3+`` reports the same bounded value; its
gradient (k2's, linear in ``x``) needs no bound. The other estimators are polynomials in ``x``.
"""

from __future__ import annotations

from typing import Callable

import torch

from armor_core import KLEstimator, hookimpl
from armor_core.hookspecs import RegisterKLEstimator
from armor_plugins.losses.utils import LOG_RATIO_CLAMP

#: the k3 estimator's value (and k3+'s) is bounded to [0, KL_BOUND] per token
KL_BOUND = 10.0

__all__ = [
    "KL_BOUND",
    "KL_ESTIMATORS",
    "kl_abs",
    "kl_abs_plus",
    "kl_k1",
    "kl_k1_plus",
    "kl_k2",
    "kl_k3",
    "kl_k3_plus",
]


def _log_ratio(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    lp = log_prob.float() if log_prob.dtype in (torch.float16, torch.bfloat16) else log_prob
    return lp - ref_log_prob.detach().to(lp.dtype)


def kl_k1(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k1 = log pi - log pi_ref per token. (bs, T) -> (bs, T)."""
    return _log_ratio(log_prob, ref_log_prob)


def kl_k2(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k2 = (log pi - log pi_ref)^2 / 2 per token. (bs, T) -> (bs, T)."""
    return 0.5 * _log_ratio(log_prob, ref_log_prob) ** 2


def kl_k3(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k3 = pi_ref/pi - 1 - log(pi_ref/pi) per token, in [0, KL_BOUND]. (bs, T) -> (bs, T)."""
    x = _log_ratio(log_prob, ref_log_prob)
    # the exponent's own clamp keeps exp finite in fp32 before the value is bounded
    return (torch.exp((-x).clamp(max=LOG_RATIO_CLAMP)) - 1 + x).clamp(min=0.0, max=KL_BOUND)  # min: rounding at x ~ 0


def kl_abs(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """|log pi - log pi_ref| per token. (bs, T) -> (bs, T)."""
    return _log_ratio(log_prob, ref_log_prob).abs()


def _straight_through(value: torch.Tensor, log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    k2 = kl_k2(log_prob, ref_log_prob)
    return value.detach() + (k2 - k2.detach())


def kl_k1_plus(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """Value of k1, gradient of k2 (straight-through). (bs, T) -> (bs, T)."""
    return _straight_through(kl_k1(log_prob, ref_log_prob), log_prob, ref_log_prob)


def kl_k3_plus(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """Value of k3, gradient of k2 (straight-through). (bs, T) -> (bs, T)."""
    return _straight_through(kl_k3(log_prob, ref_log_prob), log_prob, ref_log_prob)


def kl_abs_plus(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """Value of abs, gradient of k2 (straight-through). (bs, T) -> (bs, T).

    Matches ``abs+`` in verl's ``kl_penalty`` (its ``+`` rule: value of the named estimator, gradient of
    k2), read in verl's main-branch source, not on the v0.9.1 tag.
    """
    return _straight_through(kl_abs(log_prob, ref_log_prob), log_prob, ref_log_prob)


#: name -> estimator, the names the hook registers (config values of algorithm.kl_penalty, actor.kl_loss_type)
KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
    "abs": kl_abs,
    "k1+": kl_k1_plus,
    "k3+": kl_k3_plus,
    "abs+": kl_abs_plus,
}


@hookimpl
def armor_register_kl_estimators(register: RegisterKLEstimator) -> None:
    for name, fn in KL_ESTIMATORS.items():
        register(name, KLEstimator(fn=fn, description=(fn.__doc__ or "").split("\n")[0]))
