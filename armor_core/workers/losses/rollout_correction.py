"""Rollout correction (``algorithm.rollout_correction``): importance weights between the policy that
generated the rows and the policy being trained, applied to the per-token policy loss.

The rollout's log-probs (``rollout_log_probs``, recorded by every backend while it samples) come
from the policy that generated the rows: a vLLM engine with its own kernels, or, asynchronously,
weights a few updates old. The loss's "old" policy is the trainer's (``old_log_probs``, or the
update's own first forward when it is on policy). Where the two differ the update is off-policy,
and the estimator is biased unless each token's loss is weighted by
``r = pi_old(token) / pi_rollout(token)``. A raw ratio has unbounded variance, so it is bounded:

- ``tis_token``: ``w_t = min(r_t, cap)`` (truncated importance sampling, per token).
- ``tis_seq``: ``w = min(prod_t r_t, cap)`` for every token of the sequence.
- ``mask_token``: ``w_t = r_t`` where ``r_t <= cap``, else 0 (masked importance sampling: a token
  the sampler got badly wrong leaves the loss instead of counting at the cap).
- ``mask_seq``: ``w = prod_t r_t`` where it is ``<= cap``, else 0 for the whole sequence.

Log-ratios are clamped to ``+-LOG_RATIO_BOUND`` before ``exp``, so every weight is finite (a NaN
log-ratio gives 0). Weights carry no gradient. Metrics over valid tokens:
``rollout_correction/weight_mean``, ``rollout_correction/capped_frac`` (tokens whose ratio, or
whose sequence's ratio, exceeds the cap: truncated or masked), and
``rollout_correction/mismatch_kl``, the k3 estimate of KL(rollout || old) per token,
``E[r - 1 - log r]`` under the rollout's samples. A step whose weights are all 0 trained nothing:
the driver prints :func:`nothing_kept` for it.
"""

from __future__ import annotations

import torch

from armor_core.ops.masked import masked_mean

MODES = ("none", "tis_token", "tis_seq", "mask_token", "mask_seq")
LOG_RATIO_BOUND = 20.0  # exp(20) ~ 4.9e8: past any sensible cap, far from float32 overflow


@torch.no_grad()
def correction_weights(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor, mode: str, cap: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token weights (bs, T), float32, 0 outside the mask, and the metrics (0-d tensors).

    :param old_log_probs: (bs, T) the trained policy's log-probs of the sampled tokens.
    :param rollout_log_probs: (bs, T) the generating policy's log-probs of the same tokens.
    :param response_mask: (bs, T) 1 for response tokens.
    :param mode: one of :data:`MODES` other than ``none``.
    :param cap: ``> 0``, the largest weight (``tis_*``) or the largest ratio kept (``mask_*``).
    """
    if mode not in MODES[1:]:
        raise ValueError(f"algorithm.rollout_correction={mode!r}: expected one of {MODES[1:]}")
    if not cap > 0:
        raise ValueError(f"algorithm.rollout_correction_cap={cap!r}: must be > 0")
    if not old_log_probs.shape == rollout_log_probs.shape == response_mask.shape:
        raise ValueError(
            f"rollout correction: shapes differ: old_log_probs {tuple(old_log_probs.shape)}, "
            f"rollout_log_probs {tuple(rollout_log_probs.shape)}, response_mask {tuple(response_mask.shape)}"
        )
    log_ratio = old_log_probs.float() - rollout_log_probs.float()
    valid = response_mask.bool() & ~torch.isnan(log_ratio)
    log_ratio = torch.where(valid, log_ratio, 0.0).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    token_ratio = log_ratio.exp()
    if mode.endswith("_seq"):
        seq_log = log_ratio.sum(-1, keepdim=True).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        ratio = seq_log.exp().expand_as(log_ratio)
    else:
        ratio = token_ratio
    capped = ratio > cap
    w = ratio.clamp(max=cap) if mode.startswith("tis") else torch.where(capped, 0.0, ratio)
    w = torch.where(valid, w, 0.0)
    metrics = {
        "rollout_correction/weight_mean": masked_mean(w, valid),
        "rollout_correction/capped_frac": masked_mean(capped.float(), valid),
        "rollout_correction/mismatch_kl": masked_mean(token_ratio - 1 - log_ratio, valid),
    }
    return w, metrics


def nothing_kept(metrics: dict[str, float], step: int, mode: str, cap: float) -> str | None:
    """The warning for step ``step`` when every corrected weight was 0 (its update trained nothing), else None.

    :param metrics: the step's merged metrics (``rollout_correction/weight_mean`` over valid tokens).
    """
    weight = metrics.get("rollout_correction/weight_mean")
    if weight is None or weight > 0:
        return None
    dropped = metrics.get("rollout_correction/capped_frac", float("nan"))
    return (
        f"warning: step {step}: algorithm.rollout_correction={mode} gave every token weight 0 ({dropped:.0%} of them "
        f"past algorithm.rollout_correction_cap={cap}); this update trained nothing. Raise the cap, or check why the "
        "rollout's and the trainer's log-probs differ (rollout_correction/mismatch_kl)"
    )
