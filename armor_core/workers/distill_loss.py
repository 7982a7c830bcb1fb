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
which mode it runs. The top-k mode needs the student's log-probs at the teacher's ids: one more forward
of the micro-batch in the padded layout, through the chunked ``ResponseHead`` when the actor has one
(each position's hidden state repeated k times in the head request, never a (tokens, vocabulary) tensor).
"""

from __future__ import annotations

from typing import Any

import torch

from armor_core.workers.layouts import forward_response_logits
from armor_core.workers.lm_head import HeadRequest, response_head_of, response_head_request

__all__ = [
    "DistillLoss",
    "compute_distill_reverse_kl",
    "compute_distill_topk_forward_kl",
    "student_log_probs_at",
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


def student_log_probs_at(
    module: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    ids: torch.Tensor,
    temperature: float,
    chunk_tokens: int,
) -> torch.Tensor:
    """(bs, R, k) log-softmax of ``module``'s response positions at ``ids`` (bs, R, k); differentiable.

    Padded layout: the response positions are the last R of each row, predicted from [-R-1, -1). Through the
    chunked head when ``chunk_tokens`` and the module has one (each position asked for k targets), else from
    the full logits.
    """
    bs, T = input_ids.shape
    R, k = ids.shape[1], ids.shape[2]
    if chunk_tokens and response_head_of(module) is not None:
        dev = input_ids.device
        index = (torch.arange(bs, device=dev)[:, None] * T + torch.arange(T - R - 1, T - 1, device=dev)).reshape(-1)
        request = HeadRequest(index.repeat_interleave(k), ids.reshape(-1).to(dev), temperature, chunk_tokens, False)
        with response_head_request(module, request):
            out = module(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            ).logits[0]
        return out[:, 0].view(bs, R, k)
    logits = forward_response_logits(module, input_ids, attention_mask, position_ids, R).float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    return logits.log_softmax(-1).gather(-1, ids.to(logits.device).long())


class DistillLoss:
    """The distillation loss term of one micro-batch, as the actor adds it: ``coef * aggregate(loss_mat)``.

    ``reverse_kl`` (``via=loss``): ``sg(log p_S - log p_T) * log p_S`` per token, the score-function gradient
    of each token's reverse KL (its own estimate is its advantage; no credit flows to earlier tokens).
    ``topk_forward_kl``: ``compute_distill_topk_forward_kl`` on the student's log-probs at the teacher's ids.
    """

    def __init__(self, mode: str, coef: float, renormalize: bool, temperature: float, chunk_tokens: int) -> None:
        self.mode, self.coef, self.renormalize = mode, float(coef), renormalize
        self.temperature, self.chunk_tokens = temperature, chunk_tokens

    @staticmethod
    def from_config(cfg: Any, chunk_tokens: int) -> DistillLoss | None:
        """The loss term ``algorithm.distill`` asks for, or None (no teacher, or its signal is a reward)."""
        d = cfg.algorithm.distill
        if not d.teacher or (d.mode == "reverse_kl" and d.via == "reward"):
            return None
        return DistillLoss(d.mode, d.coef, d.renormalize, cfg.rollout.temperature, chunk_tokens)

    def __call__(
        self, module: torch.nn.Module, mini: Any, idx: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, float]:
        """``(loss_mat (rows, R), mean reverse-KL estimate on the rows' tokens)`` for rows ``idx`` of ``mini``."""
        dev = log_prob.device
        teacher_lp = mini["teacher_log_prob"][idx].to(dev)
        rkl = compute_distill_reverse_kl(log_prob.detach(), teacher_lp, mask)
        mean_rkl = float(rkl.sum() / mask.sum().clamp(min=1))
        if self.mode == "reverse_kl":
            return rkl * log_prob, mean_rkl
        ids, attn, pos = (mini[k][idx].to(dev) for k in ("input_ids", "attention_mask", "position_ids"))
        student = student_log_probs_at(
            module, ids, attn, pos, mini["teacher_topk_ids"][idx], self.temperature, self.chunk_tokens
        )
        teacher = mini["teacher_topk_log_probs"][idx].to(dev)
        return compute_distill_topk_forward_kl(student, teacher, mask, self.renormalize), mean_rkl
