"""The in-reward KL penalty (``algorithm.use_kl_in_reward``) and the penalty coefficient's controllers,
on the driver. (The KL loss the actor adds, ``actor.use_kl_loss``, is ``workers/losses/kl_loss.py``.)

PPO/RLHF style (Ziegler et al. 2019): the token-level reward becomes ``score - kl_coef * kl``, with
``kl`` from the estimator ``algorithm.kl_penalty`` names (a ``kl_estimator`` plugin; the built-in ones are
``armor_core/ops/kl.py``, applied through ``masked_kl`` as the KL loss applies them) and ``kl_coef`` from a
controller (``algorithm.kl_ctrl_type``): ``fixed``, or ``adaptive``, which steers the observed KL towards
``algorithm.kl_target``. The trainer owns this machinery; the estimators are plugins.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch

from armor_core.ops.kl import masked_kl
from armor_core.ops.masked import masked_mean
from armor_core.workers.losses.kl_loss import kl_estimator_fn

__all__ = [
    "KL_CONTROLLERS",
    "AdaptiveKLController",
    "FixedKLController",
    "apply_kl_penalty",
    "build_kl_controller",
]


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
    m = response_mask.bool()
    with torch.no_grad():
        kl = masked_kl(kl_estimator_fn(estimator), log_prob, ref_log_prob, m)
        scores = torch.where(
            m, token_level_scores, torch.zeros((), dtype=token_level_scores.dtype, device=token_level_scores.device)
        )
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


#: ``algorithm.kl_ctrl_type`` -> the controller class, built from the algorithm config's values
KL_CONTROLLERS: dict[str, Callable[[float, float, int], FixedKLController | AdaptiveKLController]] = {
    "fixed": lambda kl_coef, kl_target, kl_horizon: FixedKLController(kl_coef),
    "adaptive": AdaptiveKLController,
}


def build_kl_controller(
    kl_ctrl_type: str, kl_coef: float, kl_target: float = 0.1, kl_horizon: int = 10000
) -> FixedKLController | AdaptiveKLController:
    """The controller for ``algorithm.kl_ctrl_type`` (a key of ``KL_CONTROLLERS``) from the algorithm config values."""
    if kl_ctrl_type not in KL_CONTROLLERS:
        raise ValueError(
            f"algorithm.kl_ctrl_type={kl_ctrl_type!r}: must be one of {', '.join(repr(k) for k in KL_CONTROLLERS)}"
        )
    return KL_CONTROLLERS[kl_ctrl_type](kl_coef, kl_target, kl_horizon)
