"""Loss aggregation: how a per-token loss matrix becomes the scalar that is differentiated.

Five modes, the first four named as in verl so configs carry over (``actor.loss_agg_mode``). Writing
``l_it`` for the loss of token t of sequence i, ``m_it`` for the mask, N for the number of valid
tokens and S for the number of sequences with at least one valid token, over the whole
mini-batch on all ranks:

==========================  ================================================  ====================
mode                        loss of the whole mini-batch                      used by
==========================  ================================================  ====================
``token-mean``              ``sum_it m l / N``                                DAPO, verl default
``seq-mean-token-sum``      ``(1/S) sum_i sum_t m l``                         sequence-level sums
``seq-mean-token-mean``     ``(1/S) sum_i (sum_t m l / sum_t m)``             GRPO paper, GSPO
``seq-mean-token-sum-norm`` ``(1/S) sum_i sum_t m l / C``                     Dr. GRPO (C constant)
``token-sum``               ``sum_it m l``                                    unnormalised sums
==========================  ================================================  ====================

The contract (``hookspecs.armor_register_loss_aggregations``) is that each function returns one
micro-batch's *contribution*: it divides by the global N or S, not by the micro-batch's own
counts, so the sum of contributions over micro-batches and data-parallel ranks is exactly the
loss above (and so are its gradients). Averaging per-micro-batch means instead would weight a
token by 1/(tokens in its micro-batch), which changes with how the batch happens to be split.
When the global counts are None the micro-batch is taken to be the whole batch.

``token-sum`` is not a mode of the verl ``agg_loss`` read here (main branch, not the v0.9.1 tag);
it is the plain masked sum, as the name means in trainers that have it (e.g. Megatron-based ones).

``seq-mean-token-sum-norm`` follows Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like
Training"): every sequence's token sum is divided by the same constant C (the maximum response
length), so a token's weight does not depend on its sequence's length. The mean over sequences is
kept so the loss scale does not grow with the batch size.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Protocol

import torch

from armor_core import LossAggregation, hookimpl
from armor_core.hookspecs import RegisterLossAggregation
from armor_core.ops.masked import as_bool_mask, masked_sum, upcast

__all__ = [
    "AGGREGATIONS",
    "AggregationFn",
    "agg_seq_mean_token_mean",
    "agg_seq_mean_token_sum",
    "agg_seq_mean_token_sum_norm",
    "agg_token_mean",
    "agg_token_sum",
    "count_tokens_and_seqs",
]

#: a global count: a Python number, a 0-d tensor (e.g. after all_reduce), or None (use the local one)
Count = int | float | torch.Tensor | None


def count_tokens_and_seqs(response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(valid tokens, rows with at least one valid token)`` of a (bs, T) mask, as int64 0-d tensors.

    The worker computes these over its whole mini-batch, all-reduces them (sum) across ranks and
    passes them as ``global_num_tokens`` / ``global_num_seqs`` to every micro-batch.
    """
    m = as_bool_mask(response_mask)
    return m.sum().to(torch.int64), m.any(dim=-1).sum().to(torch.int64)


def _denominator(global_count: Count, local_count: torch.Tensor, like: torch.Tensor, name: str) -> torch.Tensor:
    count = local_count if global_count is None else global_count
    if (
        not isinstance(count, torch.Tensor) and count < 0
    ):  # tensors are not checked: that would sync the GPU per micro-batch
        raise ValueError(
            f"loss aggregation: {name}={count} is negative; it must count the valid tokens/sequences "
            "of the whole mini-batch"
        )
    count = torch.as_tensor(count, device=like.device).to(like.dtype)
    # an empty (all-masked) batch contributes 0 instead of 0/0 = NaN
    return count.clamp(min=1)


class AggregationFn(Protocol):
    """The signature of every mode (``LossAggregation``'s contract)."""

    def __call__(self, loss_mat: torch.Tensor, response_mask: torch.Tensor, *, global_num_tokens: Count = None,
                 global_num_seqs: Count = None, norm_constant: float | None = None) -> torch.Tensor: ...  # fmt: skip


class _Counts(NamedTuple):
    """A mode's keyword arguments: the mini-batch's global counts and Dr. GRPO's constant, as given."""

    tokens: Count
    seqs: Count
    norm_constant: float | None


def _mode(reduce: Callable[[torch.Tensor, torch.Tensor, _Counts], torch.Tensor]) -> AggregationFn:
    """The mode ``reduce(loss_mat, mask, counts)`` under the contract's signature: what every mode does first, done
    here once: ``loss_mat`` in fp32 at least (a bf16 sum over many tokens loses too much), the mask as bool."""

    def aggregate(loss_mat: torch.Tensor, response_mask: torch.Tensor, *, global_num_tokens: Count = None,
                  global_num_seqs: Count = None, norm_constant: float | None = None) -> torch.Tensor:  # fmt: skip
        counts = _Counts(global_num_tokens, global_num_seqs, norm_constant)
        return reduce(upcast(loss_mat), as_bool_mask(response_mask), counts)

    # the mode's name and docstring, without functools.wraps' __wrapped__: inspect.signature shows the contract's
    aggregate.__name__ = aggregate.__qualname__ = reduce.__name__
    aggregate.__doc__ = reduce.__doc__
    return aggregate


@_mode
def agg_token_mean(loss_mat: torch.Tensor, m: torch.Tensor, counts: _Counts) -> torch.Tensor:
    """Every valid token of the mini-batch weighs the same: ``sum(m * l) / N``.

    :param loss_mat: (bs, T); :param response_mask: (bs, T); :returns: 0-d contribution.
    """
    return masked_sum(loss_mat, m) / _denominator(counts.tokens, m.sum(), loss_mat, "global_num_tokens")


@_mode
def agg_seq_mean_token_sum(loss_mat: torch.Tensor, m: torch.Tensor, counts: _Counts) -> torch.Tensor:
    """Sum over each sequence's tokens, mean over sequences: ``sum_i sum_t m l / S``.

    :param loss_mat: (bs, T); :param response_mask: (bs, T); :returns: 0-d contribution.
    """
    seq_sums = masked_sum(loss_mat, m, dim=-1)
    return seq_sums.sum() / _denominator(counts.seqs, m.any(dim=-1).sum(), loss_mat, "global_num_seqs")


@_mode
def agg_seq_mean_token_mean(loss_mat: torch.Tensor, m: torch.Tensor, counts: _Counts) -> torch.Tensor:
    """Mean over each sequence's tokens, mean over sequences: ``sum_i mean_t l / S``.

    A row with no valid token has no mean; it contributes 0 and is not counted in S (the
    contract's ``global_num_seqs`` counts only rows with a valid token).

    :param loss_mat: (bs, T); :param response_mask: (bs, T); :returns: 0-d contribution.
    """
    lengths = m.sum(dim=-1).clamp(min=1).to(loss_mat.dtype)
    seq_means = masked_sum(loss_mat, m, dim=-1) / lengths
    return seq_means.sum() / _denominator(counts.seqs, m.any(dim=-1).sum(), loss_mat, "global_num_seqs")


@_mode
def agg_seq_mean_token_sum_norm(loss_mat: torch.Tensor, m: torch.Tensor, counts: _Counts) -> torch.Tensor:
    """Dr. GRPO: each sequence's token sum over a constant C, mean over sequences: ``sum_i sum_t m l / (C S)``.

    :param norm_constant: C, ``actor.loss_norm_constant`` (the worker fills in
        ``rollout.max_new_tokens`` when the config leaves it unset). None falls back to
        ``loss_mat.shape[-1]``, which is only a constant if every micro-batch is padded to the same
        length, so pass it explicitly.
    :returns: 0-d contribution.
    """
    norm_constant = counts.norm_constant
    c = float(loss_mat.shape[-1]) if norm_constant is None else float(norm_constant)
    if not c > 0:
        raise ValueError(
            f"loss aggregation 'seq-mean-token-sum-norm': norm_constant={norm_constant!r} must be > 0 "
            "(actor.loss_norm_constant, e.g. rollout.max_new_tokens)"
        )
    return masked_sum(loss_mat, m) / c / _denominator(counts.seqs, m.any(dim=-1).sum(), loss_mat, "global_num_seqs")


@_mode
def agg_token_sum(loss_mat: torch.Tensor, m: torch.Tensor, counts: _Counts) -> torch.Tensor:
    """Plain sum over every valid token of the mini-batch: ``sum(m * l)``, no normalisation.

    Needs no global count: the sum of the micro-batches' sums is the mini-batch's sum. The loss
    (and the gradient) grows with the number of tokens, so the learning rate must be sized for it.

    :param loss_mat: (bs, T); :param response_mask: (bs, T); :returns: 0-d contribution.
    """
    return masked_sum(loss_mat, m)


#: name -> function, the same names the hook registers.
AGGREGATIONS = {
    "token-mean": agg_token_mean,
    "seq-mean-token-sum": agg_seq_mean_token_sum,
    "seq-mean-token-mean": agg_seq_mean_token_mean,
    "seq-mean-token-sum-norm": agg_seq_mean_token_sum_norm,
    "token-sum": agg_token_sum,
}


@hookimpl
def armor_register_loss_aggregations(register: RegisterLossAggregation) -> None:
    for name, fn in AGGREGATIONS.items():
        register(name, LossAggregation(fn=fn, description=(fn.__doc__ or "").split("\n")[0]))
