"""Response log-probs from a forward, and the forward layouts without padding.

Padding removal (``pack_rows`` / ``packed_response_log_probs``): a batch row is a left-padded
prompt followed by a right-padded response, so a plain forward computes every pad position. Packed,
the real tokens of several rows are laid end to end in rows of about ``capacity`` tokens, each
sequence with its own positions 0..n-1; transformers reads a position that does not continue the
previous one as the start of a new sequence and masks attention block-diagonally
(``transformers.masking_utils.find_packed_sequence_indices``), so each token sees exactly what it saw
padded. Capacity bounds the attention cost: packed attention is quadratic in the packed row's length.

Prompt sharing (``pack_groups``): rows that repeat a prompt (GRPO's ``rollout.n`` samples) are laid
out as one segment, the prompt once and then each response, with a boolean 4D mask that lets each
response attend to the prompt and to itself (the groups and the mask: ``prompt_groups.py``).
``layout_rows`` picks the layout per micro-batch (``LAYOUTS`` in order, the grouped one only where
its estimated cost is lower).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import torch

from armor_core.workers.forward.lm_head import HeadRequest, response_head_request
from armor_core.workers.forward.prompt_groups import group_by_prompt, segment_attention

__all__ = [
    "ATTENTION_PENALTY",
    "LAYOUTS",
    "LayoutStats",
    "PackedRows",
    "attention_weight_of",
    "forward_response_log_probs",
    "forward_response_logits",
    "grouped_mask_supported",
    "layout_rows",
    "pack_groups",
    "pack_rows",
    "packed_capacity",
    "packed_response_log_probs",
    "response_log_probs",
]


def response_log_probs(
    logits: torch.Tensor, responses: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of ``responses`` (bs, R) under ``logits`` (bs, R, V) / temperature;
    ``responses`` (bs, R, m) asks for m tokens at each position (log-probs (bs, R, m), entropy (bs, R)).

    Dividing by the sampling temperature makes the trainer's distribution the one the rollout
    sampled from, so the PPO ratio compares like with like. Computed in float32 whatever the model
    dtype: bf16 log-softmax loses ~3 significant digits, enough to bias the ratio.
    """
    logits = logits.float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)
    many = responses.dim() == logits.dim()
    lp = torch.gather(logits, -1, responses if many else responses.unsqueeze(-1))
    lp = lp - logz.unsqueeze(-1) if many else lp.squeeze(-1) - logz
    ent = None
    if with_entropy:
        probs = torch.softmax(logits, dim=-1)
        ent = logz - (probs * logits).sum(-1)
    return lp, ent


def forward_response_logits(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
) -> torch.Tensor:
    """Logits that predict each response token: positions [-R-1, -1) of the full sequence."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    return out.logits[:, -response_length - 1 : -1, :]


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat (n,) ids and positions with the tokens at (rows, cols) placed at ``dest``; pads are ``pad_id`` at position
    0."""
    packed_ids = torch.full((n,), pad_id, dtype=input_ids.dtype, device=input_ids.device)
    packed_pos = torch.zeros(n, dtype=position_ids.dtype, device=position_ids.device)
    packed_ids[dest] = input_ids[rows, cols]
    packed_pos[dest] = position_ids[rows, cols]
    return packed_ids, packed_pos


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
    packed_ids, packed_pos = _scatter_tokens(input_ids, position_ids, rows, cols, dest, k * width, pad_id)
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
    packed_ids, packed_pos = _scatter_tokens(input_ids, position_ids, rows, cols, dest, k * width, pad_id)
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
    )


def packed_response_log_probs(
    model: torch.nn.Module,
    packed: PackedRows,
    responses: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``response_log_probs`` of a packed batch, scattered back to ``responses``' (bs, R) grid (0 where not
    computed); ``responses`` (bs, R, m): m targets per position, log-probs (bs, R, m)."""
    device = packed.input_ids.device
    resp_index = packed.response_index.to(device)
    bs, R = responses.shape[:2]
    tail = responses.shape[2:]
    targets = responses.reshape(bs * R, *tail)[resp_index]
    inputs = dict(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=packed.attention_mask)
    lp, ent = _head_log_probs(
        model, inputs, packed.predict_index.to(device), targets, temperature, with_entropy, chunk_tokens
    )

    def grid(x: torch.Tensor) -> torch.Tensor:
        return (
            torch.zeros(bs * R, *x.shape[1:], dtype=x.dtype, device=device)
            .index_copy(0, resp_index, x)
            .view(bs, R, *x.shape[1:])
        )

    return grid(lp), (grid(ent) if ent is not None else None)


def _head_log_probs(
    model: torch.nn.Module,
    inputs: dict[str, Any],
    index: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    chunk_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs, (N,) (or (N, m) for (N, m) ``targets``), and entropy, (N,), of ``targets`` predicted at the
    flat positions ``index`` of the model's (rows x sequence) output: through its ``ResponseHead`` in blocks
    of ``chunk_tokens`` tokens (``lm_head.py``), or from the full logits when ``chunk_tokens`` is 0."""
    if chunk_tokens:
        request = HeadRequest(index, targets, temperature, chunk_tokens, with_entropy)
        with response_head_request(model, request):
            out = model(**inputs, use_cache=False).logits[0]
        return out[:, :-1].reshape(targets.shape), (out[:, -1] if with_entropy else None)
    logits = model(**inputs, use_cache=False).logits
    lp, ent = response_log_probs(
        logits.reshape(-1, logits.shape[-1])[index].unsqueeze(0), targets.unsqueeze(0), temperature, with_entropy
    )
    return lp.squeeze(0), (ent.squeeze(0) if ent is not None else None)


#: layouts in the order they are tried: the first that applies to a micro-batch is used
LAYOUTS = ("grouped", "packed")


def grouped_mask_supported(model: torch.nn.Module) -> bool:
    """Whether ``model`` takes ``pack_groups``' boolean 4D mask as it is: transformers passes a 4D
    mask through unchanged, and SDPA reads a boolean one as True = attend (eager attention adds the
    mask instead, flash attention takes none)."""
    return getattr(_config(model), "_attn_implementation", None) == "sdpa"


def _config(model: torch.nn.Module) -> Any:
    """The transformers config of ``model``, or of the module a DDP wrapper holds (None if neither has one)."""
    return getattr(getattr(model, "module", model), "config", None)


@dataclass(frozen=True)
class LayoutStats:
    """What one forward computed: ``kind`` (``grouped``, ``packed`` or ``padded``), positions
    ``computed``, the ``needed`` tokens of that layout (real tokens, a shared prompt once), and the
    padded batch's real tokens ``batch`` (every prompt copy counted)."""

    kind: str
    computed: int
    needed: int
    batch: int

    @staticmethod
    def of(packed: PackedRows | None, attention_mask: torch.Tensor) -> LayoutStats:
        """The stats of a forward in layout ``packed``, or of the padded batch ``attention_mask`` when None."""
        if packed is not None:
            return LayoutStats(packed.kind, packed.computed, packed.real_tokens, packed.batch_tokens)
        real = int(attention_mask.sum())
        return LayoutStats("padded", attention_mask.numel(), real, real)


#: masked attention runs at about half the FLOP rate of the linear layers on CPU (measured with
#: benchmarks/mfu.py), so an attended pair costs twice its FLOPs in ``attention_weight_of``
ATTENTION_PENALTY = 2.0


def attention_weight_of(model: torch.nn.Module) -> float:
    """The cost of one attended (query, key) pair relative to one token through the linear layers:
    ~4 x hidden FLOPs per pair and layer (scores and values) against ~2 x parameters per token."""
    config = _config(model)
    hidden, layers = getattr(config, "hidden_size", None), getattr(config, "num_hidden_layers", None)
    params = sum(p.numel() for p in model.parameters())
    if not hidden or not layers or not params:
        return 0.0
    return ATTENTION_PENALTY * 4 * hidden * layers / (2 * params)


def layout_rows(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    layouts: Any = LAYOUTS,
    attention_weight: float = 0.0,
) -> PackedRows | None:
    """The first of ``layouts`` that lays out this micro-batch exactly (and, for ``grouped``, pays:
    see ``pack_groups``' ``attention_weight``), or None for the padded forward."""
    for kind in layouts:
        if kind == "grouped":
            packed = pack_groups(
                input_ids, attention_mask, position_ids, response_length, attention_weight=attention_weight
            )
        elif kind == "packed":
            packed = pack_rows(
                input_ids, attention_mask, position_ids, response_length, packed_capacity(attention_mask)
            )
        else:
            raise ValueError(f"unknown layout {kind!r}; known: {', '.join(LAYOUTS)}")
        if packed is not None:
            return packed
    return None


def forward_response_log_probs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    responses: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    packed: PackedRows | None = None,
    chunk_tokens: int = 0,
) -> tuple[torch.Tensor, torch.Tensor | None, LayoutStats]:
    """Response log-probs (and entropy), (bs, R), of one micro-batch: computed in the layout
    ``packed`` (``layout_rows``), or padded when it is None. ``responses`` (bs, R, m) asks for m tokens at
    each response position (column 0 the sampled one, say, then a teacher's top-k ids) in the same forward:
    log-probs (bs, R, m), entropy still (bs, R).

    :param chunk_tokens: > 0: through the model's ``ResponseHead`` (``lm_head.install_response_head``)
        in blocks of this many tokens, never holding the (tokens, vocabulary) logits; 0: from the
        model's full logits (the plain path).
    :returns: ``(log_probs, entropy, LayoutStats)``. Packed or grouped, response positions outside
        the attention mask are 0; padded, they hold whatever the model computed there.
    """
    if packed is None and not chunk_tokens:
        logits = forward_response_logits(model, input_ids, attention_mask, position_ids, responses.shape[1])
        lp, ent = response_log_probs(logits, responses, temperature, with_entropy)
        return lp, ent, LayoutStats.of(None, attention_mask)
    if packed is None:
        bs, T = input_ids.shape
        R = responses.shape[1]
        index = (
            torch.arange(bs, device=input_ids.device)[:, None] * T
            + torch.arange(T - R - 1, T - 1, device=input_ids.device)
        ).reshape(-1)
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        targets = responses.reshape(bs * R, *responses.shape[2:])
        lp, ent = _head_log_probs(model, inputs, index, targets, temperature, with_entropy, chunk_tokens)
        return (
            lp.view(responses.shape),
            (ent.view(bs, R) if ent is not None else None),
            LayoutStats.of(None, attention_mask),
        )
    lp, ent = packed_response_log_probs(model, packed, responses, temperature, with_entropy, chunk_tokens)
    return lp, ent, LayoutStats.of(packed, attention_mask)
