"""Response log-probs as the actor computes them: without the padding, each shared prompt once.

``ResponseLogProbs`` chooses a layout for each micro-batch (``layouts.layout_rows``: ``packed``
rows, ``grouped`` prompts, or the padded batch), checks once per layout that it gives this model's
padded log-probs (a model that ignores position-based sequence boundaries or a custom 4D mask would
let sequences attend to each other; such a layout is dropped with a warning), and counts what it
computed for ``perf/padding_waste`` and ``perf/prompt_sharing``. ``LayoutChoice`` is that choice
and count without the log-probs; the critic's values (``values.py``) use it too.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

from armor_core.protocol import DataProto
from armor_core.workers.collectives import equal_micro_batches
from armor_core.workers.layouts import LAYOUTS, LayoutStats, PackedRows, attention_weight_of, forward_response_log_probs, grouped_mask_supported, layout_rows

__all__ = ["LayoutChoice", "ResponseLogProbs"]


class LayoutChoice:
    """The layouts a model may use: each kind is compared once with the padded forward (``differs``:
    the mean absolute difference on valid response positions) and dropped, with a warning naming
    ``who``, when it changes the result beyond rounding.

    :param model: the module whose layouts are offered (``grouped`` needs a 4D-mask-capable model).
    """

    def __init__(self, model: torch.nn.Module, compute_dtype: torch.dtype, who: str, quantity: str) -> None:
        self.who, self.quantity = who, quantity
        self.layouts = tuple(k for k in LAYOUTS if k != "grouped" or grouped_mask_supported(model))
        self.checked: set[str] = set()
        self.attention_weight = attention_weight_of(model)  # for choosing between layouts by cost
        self.tolerance = 1e-4 if compute_dtype == torch.float32 else 2e-2  # rounding of other matmul shapes
        self.positions = [0, 0, 0]  # positions computed, tokens needed, batch tokens: see padding_metrics

    def choose(self, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, response_length: int,
               differs: Callable[[PackedRows], float]) -> PackedRows | None:
        """The layout of one micro-batch, or None for the padded forward."""
        packed = layout_rows(ids, attn, pos, response_length, self.layouts, self.attention_weight)
        while packed is not None and packed.kind not in self.checked:
            diff = differs(packed)
            if diff <= self.tolerance:
                self.checked.add(packed.kind)
                break
            warnings.warn(f"{self.who}: the {packed.kind} layout changes this model's {self.quantity} (mean |diff| {diff:.2e} > "
                          f"{self.tolerance:.0e}); not using it", stacklevel=3)
            self.layouts = tuple(k for k in self.layouts if k != packed.kind)
            packed = layout_rows(ids, attn, pos, response_length, self.layouts, self.attention_weight)
        return packed

    def count(self, stats: LayoutStats) -> None:
        for i, n in enumerate((stats.computed, stats.needed, stats.batch)):
            self.positions[i] += n

    def padding_metrics(self, prefix: str = "perf/") -> dict[str, float]:
        """``perf/padding_waste``: padded positions computed per needed token since the last call;
        ``perf/prompt_sharing``: the share of the batch's tokens not recomputed thanks to shared prompts."""
        computed, needed, batch = self.positions
        self.positions = [0, 0, 0]
        return {f"{prefix}padding_waste": (computed - needed) / max(needed, 1), f"{prefix}prompt_sharing": 1.0 - needed / max(batch, 1)}


def valid_response_positions(attn: torch.Tensor, response_length: int) -> torch.Tensor:
    """(bs, R) bool: response tokens that are real and follow a real token (the positions every layout computes)."""
    R = response_length
    return (attn[:, -R:] * attn[:, -R - 1 : -1]).bool()


class ResponseLogProbs(LayoutChoice):
    """:param model: the module whose layouts are offered (``grouped`` needs a 4D-mask-capable model).
    :param autocast: ``autocast(enabled=default)`` context for the compute dtype.
    :param split: row positions of each micro-batch, from an attention mask."""

    def __init__(self, model: torch.nn.Module, device: torch.device, compute_dtype: torch.dtype, temperature: float, chunk_tokens: int,
                 autocast: Callable[..., Any], split: Callable[[torch.Tensor], list[torch.Tensor]], rank: int = 0) -> None:
        super().__init__(model, compute_dtype, f"actor rank {rank}", "log-probs")
        self.device, self.compute_dtype, self.temperature, self.chunk_tokens = device, compute_dtype, temperature, chunk_tokens
        self.autocast, self.split, self.rank = autocast, split, rank
        # the module a layout is checked on: one whose forward is no collective (not a DDP wrapper, not
        # FSDP2 shards), since only this rank runs the check; None: the module being run
        self.check_module: torch.nn.Module | None = None

    def forward(self, module: torch.nn.Module, batch: DataProto, sl: slice | torch.Tensor, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Response log-probs (and entropy), (rows, R), of rows ``sl`` of ``batch``; with gradient
        when ``module`` is in training mode and grad is enabled."""
        ids, attn, pos, resp = (batch[k][sl].to(self.device) for k in ("input_ids", "attention_mask", "position_ids", "responses"))
        check = self.check_module if self.check_module is not None else module
        packed = self.choose(ids, attn, pos, resp.shape[1], lambda p: self._layout_diff(check, p, ids, attn, pos, resp))
        with self.autocast():
            lp, ent, stats = forward_response_log_probs(module, ids, attn, pos, resp, self.temperature, with_entropy, packed, self.chunk_tokens)
        self.count(stats)
        return lp, ent

    @torch.no_grad()
    def all_rows(self, model: torch.nn.Module, data: DataProto, with_entropy: bool, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``forward`` over every micro-batch of ``data`` in eval mode, on CPU.

        :param world_size: > 1 when ``model``'s forward is a collective (FSDP2 shards): every rank
            then runs as many forwards as the rank with the most micro-batches (stand-ins, discarded).
        """
        was_training = model.training
        model.eval()
        lps, ents = [], []
        for rows, weight in equal_micro_batches([(rows, 1.0) for rows in self.split(data["attention_mask"])], world_size):
            lp, ent = self.forward(model, data, rows, with_entropy)
            if not weight:  # a stand-in
                continue
            lps.append(lp.cpu())
            if ent is not None:
                ents.append(ent.cpu())
        model.train(was_training)
        return torch.cat(lps), (torch.cat(ents) if ents else None)

    @torch.no_grad()
    def _layout_diff(self, module: torch.nn.Module, packed: Any, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, resp: torch.Tensor) -> float:
        """Mean |log-prob difference| between the layout ``packed`` and the padded forward, on valid positions."""
        was_training = module.training
        module.eval()
        try:
            with self.autocast():
                laid_out, _, _ = forward_response_log_probs(module, ids, attn, pos, resp, self.temperature, False, packed, self.chunk_tokens)
                padded, _, _ = forward_response_log_probs(module, ids, attn, pos, resp, self.temperature, False, None, self.chunk_tokens)
        finally:
            module.train(was_training)
        valid = valid_response_positions(attn, resp.shape[1])
        return float((laid_out - padded)[valid].abs().mean()) if valid.any() else 0.0
