"""On-policy distillation's per-token math (``algorithm.distill``), and the loss term the actor adds.

A teacher scores the student's own sampled tokens (Agarwal et al. 2024, GKD; the 2025 "on-policy
distillation" recipes). Two signals, both pure tensor functions here:

- ``compute_distill_reverse_kl``: per token, ``log p_S(y_t) - log p_T(y_t)`` at the sampled token
  ``y_t ~ p_S``. Its expectation under the student is the exact per-position reverse KL
  ``KL(p_S || p_T)``, so a mean over sampled tokens estimates it without the vocabulary.
- ``compute_distill_topk_forward_kl``: ``sum_k p_T (log p_T - log p_S)`` over the teacher's k most likely
  tokens at each position (a forward-KL loss, GKD's supervised side on the student's own prefixes).

``DistillLoss`` is the actor's side when the signal is a loss term (``distill.via=loss``, or
``topk_forward_kl``): built once in the worker, one call per micro-batch, so the actor never asks
which mode it runs. The top-k mode needs the student's log-probs at the teacher's ids: the actor asks for
them (``DistillLoss.extra_ids``) in the same forward that gives the sampled tokens' log-probs, k more
targets per position in whatever layout the micro-batch takes, through the chunked ``ResponseHead`` (one
head pass per block for all 1 + k targets, never a (tokens, vocabulary) tensor). One forward per
micro-batch is what DDP and FSDP2 allow, so the top-k loss runs on any number of actor workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from armor_core.config.schema import ArmorConfig
    from armor_core.dataproto.protocol import DataProto

__all__ = [
    "DistillLoss",
    "compute_distill_reverse_kl",
    "compute_distill_topk_forward_kl",
]


def compute_distill_reverse_kl(
    log_prob: torch.Tensor, teacher_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """The per-token reverse-KL estimate ``log p_S(y_t) - log p_T(y_t)``, 0 outside the mask.

    :param log_prob: (bs, T) the student's log-probs of its sampled tokens.
    :param teacher_log_prob: (bs, T) the teacher's log-probs of the same tokens.
    :param response_mask: (bs, T) 1 on response tokens.
    :returns: (bs, T). Unbiased for ``KL(p_S || p_T)`` at each position when ``y_t ~ p_S``; one sample's
        value may be negative.
    """
    m = response_mask.bool()
    zero = torch.zeros((), dtype=log_prob.dtype, device=log_prob.device)
    return torch.where(m, log_prob - teacher_log_prob.to(log_prob.dtype), zero)


def compute_distill_topk_forward_kl(
    student_topk_log_probs: torch.Tensor,
    teacher_topk_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    renormalize: bool = True,
) -> torch.Tensor:
    """Forward KL over the teacher's top-k tokens at each position, 0 outside the mask.

    ``sum_k q_T (log q_T - log p_S)`` with the student's full-vocabulary log-probs ``log p_S`` at the k ids and
    ``q_T`` the teacher's top-k probabilities, with ``renormalize`` divided by their sum (so they weigh the k
    ids as a distribution), else as they are. Renormalised it is >= 0 (Gibbs' inequality, since the student's
    k probabilities sum to at most 1) and 0 only where the student puts all its mass on the k ids in the
    teacher's proportions: mass the student leaves outside the k is penalised. (Renormalising the student's
    too would not: a student could then move mass off the teacher's top-k at no cost.) Raw, the terms are
    the part of the full forward KL on those ids, equal to it when the k ids hold all the teacher's mass.

    :param student_topk_log_probs: (bs, T, k) the student's log-softmax at the teacher's top-k ids (differentiable).
    :param teacher_topk_log_probs: (bs, T, k) the teacher's log-probs of its top-k ids (no gradient).
    :returns: (bs, T) loss per token.
    """
    s = student_topk_log_probs.float()
    t = teacher_topk_log_probs.float().detach()
    if renormalize:
        t = t - torch.logsumexp(t, dim=-1, keepdim=True)
    kl = (t.exp() * (t - s)).sum(-1)
    m = response_mask.bool()
    return torch.where(m, kl, torch.zeros((), dtype=kl.dtype, device=kl.device))


class DistillLoss:
    """The distillation loss term of one micro-batch, as the actor adds it: ``coef * aggregate(loss_mat)``.

    ``reverse_kl`` (``via=loss``): ``sg(log p_S - log p_T) * log p_S`` per token, the score-function gradient
    of each token's reverse KL (its own estimate is its advantage; no credit flows to earlier tokens).
    ``topk_forward_kl``: ``compute_distill_topk_forward_kl`` on the student's log-probs at the teacher's ids.
    """

    def __init__(self, mode: str, coef: float, renormalize: bool) -> None:
        self.mode, self.coef, self.renormalize = mode, float(coef), renormalize

    @staticmethod
    def from_config(cfg: ArmorConfig) -> DistillLoss | None:
        """The loss term ``algorithm.distill`` asks for, or None (no teacher, or its signal is a reward)."""
        d = cfg.algorithm.distill
        if not d.teacher or (d.mode == "reverse_kl" and d.via == "reward"):
            return None
        return DistillLoss(d.mode, d.coef, d.renormalize)

    def extra_ids(self, mini: DataProto, idx: torch.Tensor) -> torch.Tensor | None:
        """(rows, R, k) the token ids whose student log-probs the term needs besides the sampled ones (the
        teacher's top-k), for the actor's forward to compute too; None for ``reverse_kl``."""
        return mini["teacher_topk_ids"][idx] if self.mode == "topk_forward_kl" else None

    def __call__(
        self,
        mini: DataProto,
        idx: torch.Tensor,
        log_prob: torch.Tensor,
        mask: torch.Tensor,
        at_ids: torch.Tensor | None,
    ) -> tuple[torch.Tensor, float]:
        """``(loss_mat (rows, R), mean reverse-KL estimate on the rows' tokens)`` for rows ``idx`` of ``mini``.

        :param log_prob: (rows, R) the student's log-probs of its sampled tokens (differentiable).
        :param at_ids: (rows, R, k) its log-probs at ``extra_ids`` from the same forward (differentiable), or None.
        """
        dev = log_prob.device
        teacher_lp = mini["teacher_log_prob"][idx].to(dev)
        rkl = compute_distill_reverse_kl(log_prob.detach(), teacher_lp, mask)
        mean_rkl = float(rkl.sum() / mask.sum().clamp(min=1))
        if self.mode == "reverse_kl":
            return rkl * log_prob, mean_rkl
        if at_ids is None:
            raise ValueError("topk_forward_kl needs the student's log-probs at the teacher's top-k ids (extra_ids)")
        teacher = mini["teacher_topk_log_probs"][idx].to(dev)
        return compute_distill_topk_forward_kl(at_ids, teacher, mask, self.renormalize), mean_rkl
