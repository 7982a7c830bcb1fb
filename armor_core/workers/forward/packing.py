"""The forward layouts without padding: where each real token of a padded (bs, T) batch sits in a packed batch.

``pack_rows`` lays the real tokens of several rows end to end (each sequence with its own positions 0..n-1);
``pack_groups`` lays rows that repeat a prompt out as one segment, the prompt once and then each response, with
a boolean 4D mask (the groups and the mask: ``prompt_groups.py``). ``layouts.py`` runs the forward over them and
chooses between them.

Long function: ``pack_groups``, the grouped layout's index arithmetic as one sequence of tensor operations, whose
intermediate indices each later line reads.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from armor_core.workers.forward.prompt_groups import group_by_prompt, segment_attention

__all__ = [
    "GROUP_MAX_TOKENS",
    "PACK_FACTOR",
    "PACK_MIN_TOKENS",
    "PackedRows",
    "pack_groups",
    "pack_rows",
    "packed_capacity",
]


@dataclass(frozen=True)
class PackedRows:
    """Where each real token of a padded (bs, T) batch sits in a packed (k, width) batch.

    ``input_ids`` / ``position_ids``: (k, width), pads have id ``pad_id`` and position 0 (so each
    pad is a one-token sequence of its own). ``predict_index``: flat indices into the (k * width)
    packed positions whose logits predict a response token; ``response_index``: flat indices into
    the (bs * R) response grid of those tokens, in the same order. ``real_tokens`` counts the
    tokens the layout must compute (a shared prompt once); ``computed`` is k * width;
    ``batch_tokens`` counts the padded batch's real (attended) tokens, shared prompts every time.
    ``kind`` is ``"packed"`` (``pack_rows``: attention follows from the positions, ``attention_mask``
    is None) or ``"grouped"`` (``pack_groups``: a (k, 1, width, width) boolean mask, True = attend).
    ``source``: (k * width,) the flat index (row x T + column) of each packed token in the padded batch, -1 for
    a pad (what a per-token input of the padded batch, such as replayed routes, becomes in this layout).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    predict_index: torch.Tensor
    response_index: torch.Tensor
    real_tokens: int
    computed: int
    batch_tokens: int = 0
    kind: str = "packed"
    attention_mask: torch.Tensor | None = None
    source: torch.Tensor | None = None


def _balance(lengths: list[int], k: int) -> tuple[int, list[int], list[int], int]:
    """Spread sequences over ``k`` rows: each, longest first, goes to the emptiest row (LPT
    scheduling, Graham 1969), so row loads end within about one sequence of each other.
    Returns (k, row of each sequence, its offset in the row, the fullest row's load)."""
    heap = [(0, j) for j in range(k)]
    row_of, offset = [0] * len(lengths), [0] * len(lengths)
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        load, j = heapq.heappop(heap)
        row_of[i], offset[i] = j, load
        heapq.heappush(heap, (load + lengths[i], j))
    return k, row_of, offset, max(max(load for load, _ in heap), 1)


#: packed row length, in units of the longest sequence: LPT leaves at most about one sequence of
#: padding per row, so rows of 4+ sequences waste <= ~25% in the worst case (~2% measured on the
#: default run), while attention, quadratic in the row length, costs ~4x the padded batch's
PACK_FACTOR = 4
#: ... and at least this many tokens, so that short sequences still fill rows of useful size
PACK_MIN_TOKENS = 64
#: the longest shared-prompt segment (``pack_groups``): its dense mask and attention grow with the
#: square of its length, so longer groups (long responses) are packed per row instead
GROUP_MAX_TOKENS = 2048


def packed_capacity(attention_mask: torch.Tensor) -> int:
    """The packed row length ``layout_rows`` asks ``pack_rows`` for: ``PACK_FACTOR`` times the
    micro-batch's longest sequence, at least ``PACK_MIN_TOKENS``."""
    longest = int(attention_mask.sum(-1).max()) if len(attention_mask) else 0
    return max(PACK_MIN_TOKENS, PACK_FACTOR * longest)


def _real_positions(
    mask: torch.Tensor, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(row, column, rank in its row) of each attended token of the (bs, T) ``mask``, or None when
    a row's real tokens do not have positions 0, 1, 2, ... (transformers would split that row)."""
    rank_in_row = mask.long().cumsum(-1) - 1
    rows, cols = mask.nonzero(as_tuple=True)
    within = rank_in_row[rows, cols]
    if not torch.equal(position_ids[rows, cols].long(), within):
        return None
    return rows, cols, within


def _scatter_tokens(
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    dest: torch.Tensor,
    n: int,
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Flat (n,) ids, positions and sources (``PackedRows.source``) with the tokens at (rows, cols) placed at
    ``dest``; pads are ``pad_id`` at position 0, from source -1."""
    packed_ids = torch.full((n,), pad_id, dtype=input_ids.dtype, device=input_ids.device)
    packed_pos = torch.zeros(n, dtype=position_ids.dtype, device=position_ids.device)
    source = torch.full((n,), -1, dtype=torch.long, device=input_ids.device)
    packed_ids[dest] = input_ids[rows, cols]
    packed_pos[dest] = position_ids[rows, cols]
    source[dest] = rows * input_ids.shape[1] + cols
    return packed_ids, packed_pos, source


def pack_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    capacity: int,
    pad_id: int = 0,
) -> PackedRows | None:
    """Pack the attended tokens of each row end to end into rows of about ``capacity`` tokens.

    :param input_ids, attention_mask, position_ids: (bs, T); the last ``response_length`` columns are the response.
    :param capacity: about how many tokens per packed row: the batch gets ceil(real tokens / capacity)
        rows, all as long as the fullest one (at least the longest sequence).
    :returns: the layout, or None when the rows cannot be packed exactly (an empty batch, or positions
        of a row's real tokens that are not 0, 1, 2, ...: transformers would split such a row into
        several sequences).

    A response token gets a log-prob when it is attended and is not its sequence's first token;
    every other response position is left out (the caller fills 0, and masks it anyway).
    """
    mask = attention_mask.bool()
    bs, T = mask.shape
    lengths = mask.sum(-1)
    located = _real_positions(mask, position_ids)
    if bs == 0 or located is None:
        return None
    rows, cols, within = located
    total = int(lengths.sum())
    k0 = max(1, min(bs, -(-total // max(int(capacity), 1))))
    # a few row counts around total / capacity: keep the one that computes the fewest positions
    k, row_of, offset, width = min(
        (_balance(lengths.tolist(), k) for k in range(k0, min(bs, k0 + 3) + 1)), key=lambda lay: lay[0] * lay[3]
    )
    row_of, offset = torch.tensor(row_of, device=mask.device), torch.tensor(offset, device=mask.device)
    dest = row_of[rows] * width + offset[rows] + within
    packed_ids, packed_pos, source = _scatter_tokens(input_ids, position_ids, rows, cols, dest, k * width, pad_id)
    start = T - response_length
    is_resp = (cols >= start) & (within > 0)
    return PackedRows(
        input_ids=packed_ids.view(k, width),
        position_ids=packed_pos.view(k, width),
        predict_index=dest[is_resp] - 1,
        response_index=rows[is_resp] * response_length + (cols[is_resp] - start),
        real_tokens=total,
        computed=k * width,
        batch_tokens=total,
        source=source,
    )


def _layout_cost(rows: int, width: float, attention_weight: float) -> float:
    """Estimated cost of ``rows`` packed rows of ``width``: positions computed, plus attended pairs (rows x width^2)."""
    return rows * width * (1.0 + attention_weight * width)


def _grouped_rows(
    lengths: list[int], attention_weight: float, max_segment: int, tokens: int, capacity: int
) -> tuple[int, list[int], list[int], int] | None:
    """``_balance``'s layout of the segments ``lengths`` over the row count of least ``_layout_cost``, or
    None when ``pack_rows``' layout of the same ``tokens`` (rows of about ``capacity``) would cost no more."""
    n_groups, total = len(lengths), sum(lengths)
    # row counts from one row per PACK_FACTOR segments' worth of tokens up to one row per segment
    widest = max(PACK_MIN_TOKENS, min(PACK_FACTOR * max(lengths), max_segment or GROUP_MAX_TOKENS))
    k0 = max(1, min(n_groups, -(-total // widest)))
    counts = sorted({min(n_groups, max(k0, round(k0 * f))) for f in (1, 1.25, 1.5, 2, 3, 4, 6, 8, 12, 16)} | {n_groups})
    k, row_of, offset, width = min(
        (_balance(lengths, k) for k in counts), key=lambda lay: _layout_cost(lay[0], lay[3], attention_weight)
    )
    # pack_rows' layout of the same rows: ceil(tokens / capacity) rows of about equal width
    packed_rows = -(-tokens // capacity)
    if _layout_cost(k, width, attention_weight) >= _layout_cost(packed_rows, tokens / packed_rows, attention_weight):
        return None
    return k, row_of, offset, width


def pack_groups(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    pad_id: int = 0,
    max_segment: int = GROUP_MAX_TOKENS,
    attention_weight: float = 0.0,
) -> PackedRows | None:
    """Pack rows that share a prompt as one segment: the prompt once, then each row's response.

    GRPO-style batches repeat every prompt ``n`` times. A response attends to its prompt and to its
    own earlier tokens only, so the prompt's hidden states are the same in every copy: computed once
    per segment, with a mask that lets each response see the prompt and itself, the forward gives
    every row's log-probs, and the backward sums the prompt's gradient over the responses, as the
    ``n`` copies would. Segments are spread over packed rows as ``pack_rows`` spreads sequences.

    :param max_segment: refuse (None) when a segment would be longer than this (0: no limit); the
        mask is dense, so attention in a segment costs its length squared.
    :param attention_weight: the cost of one attended (query, key) pair relative to one token's
        linear layers (``attention_weight_of``). The row count is the one with the least estimated
        cost (positions computed + weight x attended pairs), and the layout is refused (None) when
        ``pack_rows`` would cost less: sharing a short prompt among long responses saves fewer
        tokens than the wider rows cost in attention.
    :returns: the layout (``kind="grouped"``), or None when it cannot be exact (see ``pack_rows``),
        no two rows share a prompt, or (see ``attention_weight``) it would not pay.
    """
    mask = attention_mask.bool()
    bs, T = mask.shape
    start = T - response_length
    if bs < 2 or start <= 0:
        return None
    located = _real_positions(mask, position_ids)
    if located is None:
        return None
    groups = group_by_prompt(input_ids, mask, start)
    if groups is None or (max_segment and int(groups.segment.max()) > max_segment):
        return None
    rows_layout = _grouped_rows(
        groups.segment.tolist(), attention_weight, max_segment, int(mask.sum()), packed_capacity(attention_mask)
    )
    if rows_layout is None:
        return None
    k, row_of, offset, width = rows_layout
    seg_start = torch.tensor(row_of, device=mask.device) * width + torch.tensor(offset, device=mask.device)

    rows, cols, within = located
    is_prompt = cols < start
    keep = ~is_prompt | (rows == groups.first_row[groups.group[rows]])  # a group's prompt comes from its first row
    rows, cols, within, is_prompt = rows[keep], cols[keep], within[keep], is_prompt[keep]
    g = groups.group[rows]
    dest = seg_start[g] + torch.where(
        is_prompt, within, groups.prompt[g] + groups.resp_offset[rows] + within - groups.prompt_len[rows]
    )
    packed_ids, packed_pos, source = _scatter_tokens(input_ids, position_ids, rows, cols, dest, k * width, pad_id)
    attend = segment_attention(
        dest, g, torch.where(is_prompt, -1, rows), packed_pos, k, width, first_free=bs + groups.n_groups
    )
    # a response token is predicted by its row's previous token: the prompt's last for the first one
    is_resp = ~is_prompt & (within > 0)
    first_resp = within == groups.prompt_len[rows]
    predict = torch.where(first_resp, seg_start[g] + groups.prompt[g] - 1, dest - 1)
    return PackedRows(
        input_ids=packed_ids.view(k, width),
        position_ids=packed_pos.view(k, width),
        predict_index=predict[is_resp],
        response_index=rows[is_resp] * response_length + (cols[is_resp] - start),
        real_tokens=int(groups.segment.sum()),
        computed=k * width,
        batch_tokens=int(mask.sum()),
        kind="grouped",
        attention_mask=attend.unsqueeze(1),
        source=source,
    )
