"""Sampling-mask replay: the trainer's log-probs over the token set the rollout sampled from.

With ``rollout.top_p < 1`` or ``rollout.top_k > 0`` a token is drawn from a truncated distribution: the
policy's, restricted to the kept set ``S`` (the top-k tokens, or the smallest prefix of the sorted
distribution whose mass reaches top_p) and renormalised, ``p(a) / p(S)``. A trainer that scores the token
over the whole vocabulary, ``p(a)``, is off by the kept mass ``p(S)`` at every position: the importance
ratio against the probability the token was really drawn with reads ``p(S)`` (about 0.9 at top_p 0.9),
not 1, and the policy gradient leaves out ``-grad log p(S)``. Replay closes the gap: the rollout records
``S`` at every position (``rollout_kept_ids``, (rows, R, K) token ids, -1 past the set's end) and the
probability it drew with (``rollout_log_probs``, truncated); every log-prob the trainer compares with
it (old, training, reference, teacher) is ``log p(a) - log p(S)`` over the same ``S``
(``replayed``), computed from the same forward by asking the head for the K kept ids besides the
sampled one, so every layout (padded, packed, grouped, chunked head) supports it unchanged.

``rollout.sampling_replay=false`` records no set: the rollout still logs the probability it drew with,
and the trainer scores over the whole vocabulary, so ``rollout/logprob_diff_mean`` shows the gap.
``rollout/kept_mass`` (the rollout's ``p(S)``, averaged over response tokens) says how much was cut.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = [
    "KEPT_IDS",
    "KEPT_MASS",
    "KeptRecord",
    "kept_outputs",
    "kept_set",
    "pad_kept",
    "replayed",
    "same_kept_width",
    "truncate",
]

#: the batch keys: the kept token ids (rows, R, K) int32, -1 past each set's end; the kept mass (rows, R)
KEPT_IDS, KEPT_MASS = "rollout_kept_ids", "rollout_kept_mass"


def truncate(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """``scaled`` (rows, V) logits with every token outside the top-k / top-p set at -inf.

    Nucleus (Holtzman et al., 2020): the smallest prefix of the sorted distribution whose mass reaches
    ``top_p``; a token is dropped when the mass *before* it already does, so the first is always kept.
    """
    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        drop_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
        drop_sorted[:, 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def kept_set(truncated: torch.Tensor, log_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept set of each row of ``truncate``'s output and its mass under the untruncated distribution.

    :param truncated: (rows, V) logits, -inf outside the kept set.
    :param log_probs: (rows, V) the untruncated log-probs (``log_softmax`` of the same scaled logits).
    :returns: ``(ids, log_mass)``: ids (rows, K) int32, K the largest set among the rows, the kept tokens
        most likely first and -1 past a row's own set; log_mass (rows,) ``log p(S)``.
    """
    kept = torch.isfinite(truncated)
    counts = kept.sum(-1)
    width = int(counts.max()) if counts.numel() else 0
    order = torch.topk(truncated, width, dim=-1).indices  # the kept tokens sort first: they alone are finite
    ids = torch.where(torch.arange(width, device=order.device) < counts[:, None], order, -1).to(torch.int32)
    return ids, torch.logsumexp(log_probs.masked_fill(~kept, float("-inf")), dim=-1)


def pad_kept(steps: list[torch.Tensor], rows: int, length: int) -> torch.Tensor:
    """One (rows, length, K) int32 tensor from per-step (rows, K_t) kept ids (-1 padded), steps past the list -1."""
    width = max((s.shape[-1] for s in steps), default=1)
    out = torch.full((rows, length, max(width, 1)), -1, dtype=torch.int32)
    for t, s in enumerate(steps):
        out[:, t, : s.shape[-1]] = s.to(out.device)
    return out


def replayed(log_probs: torch.Tensor, kept_log_probs: torch.Tensor, kept_ids: torch.Tensor) -> torch.Tensor:
    """``log p(a) - log p(S)``: the log-probs of the sampled tokens under the distribution restricted to the kept set.

    :param log_probs: (rows, R) the sampled tokens' log-probs over the whole vocabulary.
    :param kept_log_probs: (rows, R, K) the log-probs of ``kept_ids`` from the same forward (any value where
        the id is -1).
    :param kept_ids: (rows, R, K) the rollout's kept sets, -1 past each set's end; a position with no set at all
        (outside the response, or a greedy token) keeps its full-vocabulary log-prob.
    """
    pad = kept_ids < 0
    has = ~pad.all(-1, keepdim=True)
    # a position without a set takes the logsumexp of zeros (finite, and its gradient is 0 through the where below)
    masked = torch.where(has, kept_log_probs.masked_fill(pad, float("-inf")), torch.zeros_like(kept_log_probs))
    log_mass = torch.where(has.squeeze(-1), torch.logsumexp(masked, dim=-1), torch.zeros_like(log_probs))
    return log_probs - log_mass


class KeptRecord:
    """A decoding loop's kept sets and masses, step by step, in its output rows (the ``hf`` backend's record)."""

    def __init__(self, b: int, max_new: int, device: torch.device) -> None:
        self.b, self.max_new = b, max_new
        self.steps: list[torch.Tensor] = []  # step t's kept sets (b, K_t), -1 where none
        self.mass = torch.ones((b, max_new), dtype=torch.float32, device=device)
        self.truncated = False  # whether any draw was

    def add(
        self, rows: torch.Tensor, t: int, live: torch.Tensor, kept: tuple[torch.Tensor, torch.Tensor] | None
    ) -> None:
        if kept is None:  # an untruncated draw
            return
        self.truncated = True
        self.mass[rows, t] = torch.where(live, kept[1].exp(), 1.0)
        ids = torch.full((self.b, kept[0].shape[-1]), -1, dtype=torch.int32, device=self.mass.device)
        ids[rows] = torch.where(live[:, None], kept[0], -1)
        self.steps.append(ids)

    def result(self, with_sets: bool) -> tuple[torch.Tensor | None, torch.Tensor] | None:
        """``(kept ids or None, kept mass)``, or None when no draw truncated."""
        if not self.truncated:
            return None
        return (pad_kept(self.steps, self.b, self.max_new) if with_sets else None), self.mass


def kept_outputs(pieces: list[tuple[torch.Tensor | None, torch.Tensor]], max_new: int) -> dict[str, torch.Tensor]:
    """Micro-batches' ``KeptRecord.result``s as a rollout's ``rollout_kept_ids`` / ``rollout_kept_mass``, on CPU."""
    out = {KEPT_MASS: torch.cat([mass.cpu() for _, mass in pieces])}
    if pieces[0][0] is not None:
        width = max(ids.shape[-1] for ids, _ in pieces if ids is not None)
        out[KEPT_IDS] = torch.cat(
            [F.pad(ids.cpu(), (0, width - ids.shape[-1]), value=-1) for ids, _ in pieces if ids is not None]
        )
    return out


def same_kept_width(batches: list[Any]) -> list[Any]:
    """DataProtos whose kept sets (``rollout_kept_ids``) are padded with -1 to the widest among them: each batch's
    width is its own largest set, so the shares of several workers, or the batches of one step, differ. The others
    are returned as they are."""
    widths = [b.tensors[KEPT_IDS].shape[-1] for b in batches if KEPT_IDS in b.tensors]
    if not widths or min(widths) == max(widths):
        return batches
    out = []
    for b in batches:
        ids = b.tensors.get(KEPT_IDS)
        if ids is not None and ids.shape[-1] < max(widths):
            b = b.select(tensor_keys=list(b.tensors), non_tensor_keys=list(b.non_tensors))
            b[KEPT_IDS] = F.pad(ids, (0, max(widths) - ids.shape[-1]), value=-1)
        out.append(b)
    return out
