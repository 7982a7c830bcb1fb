"""KL(pi || pi_ref) estimators, the KL loss term, the in-reward KL penalty and its controllers.

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
=======  ==============================  =============================================

Why the ``+`` variants: as a *loss*, what matters is the gradient. Differentiating k1 or k3
through the samples only (the sampling distribution is held fixed, as in every LLM trainer)
gives a gradient whose expectation is 0 for k1 (``E_pi[grad log pi] = 0``) and the gradient of
KL(pi_ref || pi), the other direction, for k3; while ``grad k2 = x grad log pi`` is, in
expectation, the score-function gradient of KL(pi || pi_ref) itself (Tang & Munos 2025, "On a few
pitfalls in KL divergence gradient estimation for RL"). ``k1+``/``k3+`` report the familiar
k1/k3 values while optimising with the gradient of k2: ``value + (k2 - sg(k2))``.

k3 exponentiates ``-x``, so a token the policy has made far less likely than the reference
(``x = -30``) would weigh ``exp(30) ~ 1e13`` in the loss. Its value is bounded to ``[0, 10]``
(``KL_BOUND``, as verl bounds it): a token past the bound adds 10 and no gradient, so a few such
tokens cannot swamp the loss of a whole batch. ``k3+`` reports the same bounded value; its
gradient (k2's, linear in ``x``) needs no bound. The other estimators are polynomials in ``x``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch

from armor_core import KLEstimator, hookimpl
from armor_plugins.losses.utils import LOG_RATIO_CLAMP, as_bool_mask, masked_mean

#: the k3 estimator's value (and k3+'s) is bounded to [0, KL_BOUND] per token
KL_BOUND = 10.0

__all__ = [
    "KL_BOUND",
    "KL_ESTIMATORS",
    "AdaptiveKLController",
    "FixedKLController",
    "apply_kl_penalty",
    "build_kl_controller",
    "compute_kl_loss",
    "kl_abs",
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


#: name -> estimator, the names the hook registers (config values of algorithm.kl_penalty, actor.kl_loss_type)
KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
    "abs": kl_abs,
    "k1+": kl_k1_plus,
    "k3+": kl_k3_plus,
}


def _resolve(estimator: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if isinstance(estimator, KLEstimator):
        return estimator.fn
    if isinstance(estimator, str):
        if estimator in KL_ESTIMATORS:
            return KL_ESTIMATORS[estimator]
        from armor_core.plugins import get_plugin  # a third-party estimator: the same lookup as the config

        return get_plugin("kl_estimator", estimator).fn
    if callable(estimator):
        return estimator
    raise TypeError(f"KL estimator must be a registered name ({', '.join(KL_ESTIMATORS)}, ...), a KLEstimator or a function; got {type(estimator).__name__}")


def compute_kl_loss(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, response_mask: torch.Tensor, kl_coef: float, estimator: Any = "k3") -> tuple[torch.Tensor, dict[str, Any]]:
    """KL as a loss term (GRPO style): ``kl_coef * kl`` per token, 0 outside the mask.

    Unaggregated, so the worker adds it to the policy loss matrix and aggregates once.

    :param log_prob: (bs, T) differentiable; :param ref_log_prob: (bs, T) reference, no gradient.
    :param estimator: a name (``actor.kl_loss_type``), a ``KLEstimator`` or a function.
    :returns: ``(loss_mat (bs, T), {"kl_loss": mean KL over valid tokens (detached)})``.
    """
    m = as_bool_mask(response_mask)
    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    # sanitise padded positions before the estimator: exp() of garbage there must not make NaN grads
    kl = _resolve(estimator)(torch.where(m, log_prob, zero), torch.where(m, ref_log_prob, zero))
    loss_mat = torch.where(m, kl_coef * kl, torch.zeros((), dtype=kl.dtype, device=kl.device))
    return loss_mat, {"kl_loss": masked_mean(kl.detach(), m)}


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    estimator: Any = "k1",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Fold a KL penalty into the token-level reward (PPO/RLHF style, Ziegler et al. 2019).

    ``rewards = scores - kl_coef * kl`` at valid tokens, 0 elsewhere; no gradient flows (the
    reward is data). Called by the trainer when ``algorithm.use_kl_in_reward``.

    :param token_level_scores: (bs, T) scores from the reward domains (on the last token).
    :param log_prob: (bs, T) log-probs of the policy that sampled the batch.
    :param ref_log_prob: (bs, T) reference log-probs.
    :param kl_coef: the controller's current ``value``.
    :param estimator: ``algorithm.kl_penalty``: a name, a ``KLEstimator`` or a function.
    :returns: ``(token_level_rewards (bs, T), metrics)`` with ``reward_kl`` (the batch's mean over
        sequences of each sequence's mean per-token KL; feed it to ``controller.update``) and
        ``reward_kl_coef``.
    """
    m = as_bool_mask(response_mask)
    with torch.no_grad():
        zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
        kl = _resolve(estimator)(torch.where(m, log_prob, zero), torch.where(m, ref_log_prob, zero))
        scores = torch.where(m, token_level_scores, torch.zeros((), dtype=token_level_scores.dtype, device=token_level_scores.device))
        rewards = torch.where(m, scores - kl_coef * kl.to(scores.dtype), torch.zeros_like(scores))
        seq_kl = masked_mean(kl, m, dim=-1)
        current_kl = masked_mean(seq_kl, m.any(dim=-1))
    return rewards, {"reward_kl": float(current_kl), "reward_kl_coef": float(kl_coef)}


class FixedKLController:
    """A constant KL coefficient (``algorithm.kl_ctrl_type: fixed``)."""

    def __init__(self, kl_coef: float) -> None:
        if not kl_coef >= 0:
            raise ValueError(f"FixedKLController: kl_coef={kl_coef} must be >= 0 (algorithm.kl_coef)")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Steers the observed KL towards a target (Ziegler et al. 2019, "Fine-Tuning Language Models
    from Human Preferences").

    After each batch: ``e = clip(kl / target - 1, -0.2, 0.2)``, ``coef *= 1 + e * n_steps / horizon``.
    The +-0.2 clip keeps one noisy batch from moving the coefficient by more than
    ``0.2 * n_steps / horizon``.

    :param init_kl_coef: ``algorithm.kl_coef``; :param target: ``algorithm.kl_target``;
    :param horizon: ``algorithm.kl_horizon`` (samples over which the error is corrected).
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int) -> None:
        if not init_kl_coef >= 0:
            raise ValueError(f"AdaptiveKLController: init_kl_coef={init_kl_coef} must be >= 0 (algorithm.kl_coef)")
        if not target > 0:
            raise ValueError(f"AdaptiveKLController: target={target} must be > 0 (algorithm.kl_target)")
        if not horizon >= 1:
            raise ValueError(f"AdaptiveKLController: horizon={horizon} must be >= 1 (algorithm.kl_horizon)")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adjust ``value`` after a batch of ``n_steps`` samples whose mean KL was ``current_kl``.

        A non-finite ``current_kl`` leaves the coefficient unchanged (the guard reports it).
        """
        current_kl = float(current_kl)
        if not math.isfinite(current_kl):
            return
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        self.value = float(state["value"])


def build_kl_controller(kl_ctrl_type: str, kl_coef: float, kl_target: float = 0.1, kl_horizon: int = 10000) -> FixedKLController | AdaptiveKLController:
    """The controller for ``algorithm.kl_ctrl_type`` (``fixed`` or ``adaptive``) from the algorithm config values."""
    if kl_ctrl_type == "fixed":
        return FixedKLController(kl_coef)
    if kl_ctrl_type == "adaptive":
        return AdaptiveKLController(kl_coef, kl_target, kl_horizon)
    raise ValueError(f"algorithm.kl_ctrl_type={kl_ctrl_type!r}: must be 'fixed' or 'adaptive'")


@hookimpl
def armor_register_kl_estimators(register) -> None:
    for name, fn in KL_ESTIMATORS.items():
        register(name, KLEstimator(fn=fn, description=(fn.__doc__ or "").split("\n")[0]))
