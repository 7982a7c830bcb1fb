"""How far one optimizer step moved the policy, in nats per token: the ``policy_kl`` statistic of guard stage ``step``.

The weights' relative change (``update_ratio``) says how far a step moved the parameters, and what counts
as too far depends on the model and the learning rate. What the policy *does* differently does not: the
KL divergence between the policy before and after the step, on the tokens it was just trained on, is in
nats per token for any model, task or optimizer. That is the quantity PPO's trust region and early stop
(Schulman et al. 2015, 2017; Stable Baselines' ``target_kl``) and rsl_rl's adaptive learning rate bound.

Measured on a probe: the first ``rows`` rows of the mini-batch's first micro-batch that had a gradient,
whose log-probs under the old weights the loss's forward already computed. After ``optimizer.step`` one
forward (no gradient) of those rows gives the new log-probs, and the k3 estimator of KL(old || new) on
the sampled tokens, ``(r - 1) - log r`` with ``r = p_new / p_old`` (Schulman 2020, "Approximating KL
divergence"), is unbiased for tokens sampled from the old policy and never negative. Token sums and
counts are summed over data-parallel ranks, so every rank reads the same number; under FSDP2 the
forward is a collective that every rank runs once.

The probe costs one forward of ``rows`` rows per optimizer step; it runs only when a guard lists
``policy_kl`` in its ``needs`` (``GuardRunner.wants``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import torch

from armor_core.workers.parallel.collectives import global_sums

if TYPE_CHECKING:
    from armor_core.dataproto.protocol import DataProto

__all__ = ["PROBE_ROWS", "PolicyShiftProbe", "k3_kl"]

#: rows per rank in the probe: enough tokens that the mean is steady, few enough that the forward is cheap
PROBE_ROWS = 16

#: log-ratio clamp before exp: exp overflows in fp32 past ~88, and a KL this far out is already a verdict
_MAX_LOG_RATIO = 20.0


def k3_kl(new_lp: torch.Tensor, old_lp: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """(sum over masked tokens of ``(r - 1) - log r``, token count), ``r = exp(new_lp - old_lp)``; (rows, R) each."""
    log_r = (new_lp.float() - old_lp.float()).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)
    k3 = (torch.expm1(log_r) - log_r) * mask
    return float(k3.sum()), float(mask.sum())


class PolicyShiftProbe:
    """Keeps the old log-probs of a few trained rows, and after the optimizer step measures ``policy_kl`` on them.

    :param rows: rows in the probe (per rank); 0 turns it off.
    """

    def __init__(self, rows: int) -> None:
        self.rows = int(rows)
        self._kept: tuple[DataProto, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self._teacher: torch.Tensor | None = None  # the teacher's log-probs of the kept rows' tokens, if any

    def reset(self) -> None:
        self._kept = self._teacher = None

    def keep(
        self, mini: DataProto, idx: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor, weight: float
    ) -> None:
        """Offered each micro-batch's rows and their log-probs under the weights about to be stepped; keeps the
        first offer (a stand-in micro-batch, ``weight`` 0, is kept with a zero mask so ranks stay in step)."""
        if self.rows <= 0 or self._kept is not None:
            return
        k = min(self.rows, len(idx))
        self._kept = (mini, idx[:k], log_prob.detach()[:k], mask[:k] * float(weight))
        if "teacher_log_prob" in mini:  # a distillation run: how far the policy is from its teacher, on the same rows
            self._teacher = mini["teacher_log_prob"][idx[:k]].to(log_prob.device)

    def measure(self, forward: Callable[[DataProto, torch.Tensor], torch.Tensor], world_size: int) -> dict[str, float]:
        """``{"policy_kl": mean k3 per token over every rank's probe}`` after the step (empty if nothing was kept),
        and in a distillation run ``teacher_kl``: KL(policy before the step || teacher), same tokens and estimator.

        :param forward: ``forward(mini, idx) -> log-probs (rows, R)`` under the stepped weights, without gradient.
        """
        if self._kept is None:
            return {}
        mini, idx, old, mask = self._kept
        teacher, self._kept, self._teacher = self._teacher, None, None
        with torch.no_grad():
            new = forward(mini, idx)
        sums = [*k3_kl(new, old, mask), *(k3_kl(teacher, old, mask)[:1] if teacher is not None else ())]
        total, count, *to_teacher = global_sums(sums, world_size)  # every rank has a teacher, or none has
        if count <= 0:
            return {}
        return {"policy_kl": total / count, **({"teacher_kl": to_teacher[0] / count} if to_teacher else {})}
