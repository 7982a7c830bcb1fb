"""Response log-probs from a forward, and the forward layouts without padding.

The layouts themselves (where each real token of a padded batch goes) are ``packing.py``'s; here, the forward
passes over them and the choice between them.

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

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from armor_core.workers.forward.lm_head import HeadRequest, response_head_request
from armor_core.workers.forward.packing import PackedRows, pack_groups, pack_rows, packed_capacity

__all__ = [
    "ATTENTION_PENALTY",
    "LAYOUTS",
    "LayoutStats",
    "attention_weight_of",
    "forward_response_log_probs",
    "forward_response_logits",
    "grouped_mask_supported",
    "layout_rows",
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
    layouts: Sequence[str] = LAYOUTS,
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
