"""``rollout_mismatch``: the rollout engine and the trainer disagree about the sampled tokens' log-probs.

The rollout backend samples with its own kernels (vLLM, bf16, a different attention and sampling
path); the trainer recomputes the same tokens' log-probs for the loss. Both should be the same
policy, but they differ, and the difference makes the "on-policy" update silently off-policy (Yao
et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"). The
trainer reports ``rollout/logprob_diff_mean`` (mean ``|old - rollout|`` over valid tokens) and
``rollout/logprob_diff_max``.

Two tools here:

* :class:`RolloutMismatchGuard` reads those statistics at whichever stage carries them (``update``,
  or an earlier stage if the trainer reports them before the update) and asks to ``skip`` the
  update when the mismatch is severe: a mean gap of 0.2 nats means the sampler and the trainer
  disagree by ~20 % per token, typically a stale or broken weight sync rather than numerics. No
  coefficient fixes that, so there is no ``adjust``; mild mismatch proceeds and is corrected per
  token by importance weights:
* :func:`compute_tis_weights`, truncated importance sampling (TIS, Yao et al. 2025; Ionides 2008,
  "Truncated Importance Sampling"): weight each token's loss by ``min(pi_old / pi_rollout, cap)``,
  or drop the tokens whose ratio exceeds the cap (``mode="mask"``).
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

import torch

from armor_core import Verdict, hookimpl
from armor_plugins.guards._common import check_param, finite_stat
from armor_plugins.losses.utils import LOG_RATIO_CLAMP, as_bool_mask, masked_max, masked_mean, masked_min

__all__ = ["RolloutMismatchGuard", "compute_tis_weights"]

NAME = "rollout_mismatch"


def compute_tis_weights(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    cap: float = 2.0,
    mode: Literal["truncate", "mask"] = "truncate",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token importance weights that correct for the rollout engine's log-prob mismatch.

    With ``r = exp(old_log_probs - rollout_log_probs)`` (the trainer's probability of the sampled
    token over the sampler's):

    * ``mode="truncate"``: ``w = min(r, cap)`` (TIS; Yao et al. use cap 2).
    * ``mode="mask"``: ``w = 1`` where ``r <= cap``, else ``0``: tokens the sampler got badly
      wrong are dropped from the loss, the rest count as on-policy.

    The log-ratio is clamped to ``+-LOG_RATIO_CLAMP`` (20) before ``exp``: ``exp`` overflows fp32
    past ~88.7, and ``exp(20) ~ 4.9e8`` is beyond any sensible cap, so no weight changes. So ``w``
    is finite for any finite input (an infinite log-ratio is clamped too); a NaN log-ratio gives
    weight 0. The weights carry no gradient.

    :param old_log_probs: (bs, T) the trainer's log-probs of the sampled tokens.
    :param rollout_log_probs: (bs, T) the rollout engine's log-probs of the same tokens.
    :param response_mask: (bs, T) 1 for response tokens; ``w`` is 0 elsewhere.
    :param cap: ``> 0``, the largest weight (truncate) or the largest ratio kept (mask).
    :returns: ``(weights (bs, T) float32 or wider, metrics)``; metrics (0-d tensors over valid
        tokens, 0 when there are none): ``rollout/tis_weight_mean``, ``rollout/tis_capped_frac``
        (fraction with ``r > cap``), ``rollout/tis_ratio_max``, ``rollout/tis_ratio_min``.
    """
    if not cap > 0:
        raise ValueError(f"compute_tis_weights: cap={cap!r} must be > 0 (TIS typically uses 2)")
    if mode not in ("truncate", "mask"):
        raise ValueError(f"compute_tis_weights: mode={mode!r}; expected 'truncate' or 'mask'")
    if old_log_probs.shape != rollout_log_probs.shape or old_log_probs.shape != response_mask.shape:
        raise ValueError(f"compute_tis_weights: shapes differ: old_log_probs {tuple(old_log_probs.shape)}, "
                         f"rollout_log_probs {tuple(rollout_log_probs.shape)}, response_mask {tuple(response_mask.shape)}; all must be (bs, T)")
    dtype = torch.promote_types(torch.promote_types(old_log_probs.dtype, rollout_log_probs.dtype), torch.float32)
    log_ratio = (old_log_probs.detach().to(dtype) - rollout_log_probs.detach().to(dtype))
    valid = as_bool_mask(response_mask) & ~torch.isnan(log_ratio)
    zero = torch.zeros((), dtype=dtype, device=log_ratio.device)
    ratio = torch.exp(torch.where(valid, log_ratio, zero).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    capped = ratio > cap
    if mode == "truncate":
        w = ratio.clamp(max=cap)
    else:
        w = torch.where(capped, zero, torch.ones((), dtype=dtype, device=ratio.device))
    w = torch.where(valid, w, zero)
    metrics = {
        "rollout/tis_weight_mean": masked_mean(w, valid),
        "rollout/tis_capped_frac": masked_mean(capped.to(dtype), valid),
        "rollout/tis_ratio_max": masked_max(ratio, valid),
        "rollout/tis_ratio_min": masked_min(ratio, valid),
    }
    return w, metrics


class RolloutMismatchGuard:
    """Skip the update when the rollout engine's log-probs are far from the trainer's.

    :param max_diff_mean: ``rollout/logprob_diff_mean`` (nats per token) above this skips.
    :param max_diff_max: ``rollout/logprob_diff_max`` above this skips (None: not checked; the
        largest gap over every token of a batch is dominated by rare tokens and is noisy).
    """

    def __init__(self, max_diff_mean: float = 0.2, max_diff_max: float | None = None) -> None:
        check_param(NAME, "max_diff_mean", max_diff_mean, gt=0)
        if max_diff_max is not None:
            check_param(NAME, "max_diff_max", max_diff_max, gt=0)
        self.max_diff_mean = float(max_diff_mean)
        self.max_diff_max = None if max_diff_max is None else float(max_diff_max)
        self.skips = 0

    def observe(self, stage: str, stats: Mapping[str, float], step: int) -> Verdict:
        checks = [("rollout/logprob_diff_mean", self.max_diff_mean)]
        if self.max_diff_max is not None:
            checks.append(("rollout/logprob_diff_max", self.max_diff_max))
        for key, limit in checks:
            v = finite_stat(stats, key)
            if v is not None and v > limit:
                self.skips += 1
                return Verdict("skip", f"{key} {v:.4g} above {limit:g}: the rollout engine and the trainer disagree about the sampled tokens "
                               "(stale or broken weight sync?)", signal=v, threshold=limit)
        return Verdict.proceed()

    def state_dict(self) -> dict[str, Any]:
        return {"skips": self.skips}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.skips = int(state.get("skips", 0))


@hookimpl
def armor_register_stability_guards(register):
    register(NAME, RolloutMismatchGuard)
