"""``rollout_mismatch``: the rollout engine and the trainer disagree about the sampled tokens' log-probs.

The rollout backend samples with its own kernels (vLLM, bf16, a different attention and sampling
path); the trainer recomputes the same tokens' log-probs for the loss. Both should be the same
policy, but they differ, and the difference makes the "on-policy" update silently off-policy (Yao
et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"). The
trainer reports ``rollout/logprob_diff_mean`` (mean ``|old - rollout|`` over valid tokens) and
``rollout/logprob_diff_max``.

:class:`RolloutMismatchGuard` reads those statistics before the update is made, where they are
first known: at stage ``advantage`` when the driver computed old log-probs (not exactly on-policy),
at stage ``grad`` on the update's first (and, on-policy, only) mini-batch otherwise; it does not watch
``update``, where they arrive again once a ``skip`` is too late. It asks to ``skip`` the update
when the mismatch is severe: a mean gap of 0.2 nats means the sampler and the trainer disagree by
~20 % per token, typically a stale or broken weight sync rather than numerics. No coefficient fixes
that, so there is no ``adjust``. Mild mismatch proceeds and is corrected per token by importance
weights on the loss: ``algorithm.rollout_correction`` (``armor_core/workers/losses/rollout_correction.py``).
"""

from __future__ import annotations

from typing import Any, Mapping

from armor_core import Verdict, hookimpl
from armor_core.hookspecs import RegisterStabilityGuard
from armor_core.stability.helpers import check_param, finite_stat

__all__ = ["RolloutMismatchGuard"]

NAME = "rollout_mismatch"


class RolloutMismatchGuard:
    """Skip the update when the rollout engine's log-probs are far from the trainer's.

    :param max_diff_mean: ``rollout/logprob_diff_mean`` (nats per token) above this skips.
    :param max_diff_max: ``rollout/logprob_diff_max`` above this skips (None: not checked; the
        largest gap over every token of a batch is dominated by rare tokens and is noisy).
    """

    stages = ("advantage", "grad")
    actions = {"advantage": ("skip",), "grad": ("skip",)}

    def __init__(self, max_diff_mean: float = 0.2, max_diff_max: float | None = None) -> None:
        check_param(NAME, "max_diff_mean", max_diff_mean, gt=0)
        if max_diff_max is not None:
            check_param(NAME, "max_diff_max", max_diff_max, gt=0)
        self.max_diff_mean = float(max_diff_mean)
        self.max_diff_max = None if max_diff_max is None else float(max_diff_max)
        self.skips = 0

    def observe(self, stage: str, stats: Mapping[str, float], step: int) -> Verdict:
        if stage not in self.stages:
            return Verdict.proceed()
        checks = [("rollout/logprob_diff_mean", self.max_diff_mean)]
        if self.max_diff_max is not None:
            checks.append(("rollout/logprob_diff_max", self.max_diff_max))
        for key, limit in checks:
            v = finite_stat(stats, key)
            if v is not None and v > limit:
                self.skips += 1
                return Verdict(
                    "skip",
                    f"{key} {v:.4g} above {limit:g}: the rollout engine and the trainer disagree about the sampled "
                    "tokens (stale or broken weight sync?)",
                    signal=v,
                    threshold=limit,
                )
        return Verdict.proceed()

    def state_dict(self) -> dict[str, Any]:
        return {"skips": self.skips}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.skips = int(state.get("skips", 0))


@hookimpl
def armor_register_stability_guards(register: RegisterStabilityGuard) -> None:
    register(NAME, RolloutMismatchGuard)
