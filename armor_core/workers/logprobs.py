"""Response log-probs as the actor computes them: without the padding, each shared prompt once.

``ResponseLogProbs`` chooses a layout for each micro-batch (``common.layout_rows``: ``packed``
rows, ``grouped`` prompts, or the padded batch), checks once per layout that it gives this model's
padded log-probs (a model that ignores position-based sequence boundaries or a custom 4D mask would
let sequences attend to each other; such a layout is dropped with a warning), and counts what it
computed for ``perf/padding_waste`` and ``perf/prompt_sharing``.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

from armor_core.protocol import DataProto
from armor_core.workers.layouts import LAYOUTS, attention_weight_of, forward_response_log_probs, grouped_mask_supported, layout_rows

__all__ = ["ResponseLogProbs"]


class ResponseLogProbs:
    """:param model: the module whose layouts are offered (``grouped`` needs a 4D-mask-capable model).
    :param autocast: ``autocast(enabled=default)`` context for the compute dtype.
    :param split: row positions of each micro-batch, from an attention mask."""

    def __init__(self, model: torch.nn.Module, device: torch.device, compute_dtype: torch.dtype, temperature: float, chunk_tokens: int,
                 autocast: Callable[..., Any], split: Callable[[torch.Tensor], list[torch.Tensor]], rank: int = 0) -> None:
        self.device, self.compute_dtype, self.temperature, self.chunk_tokens = device, compute_dtype, temperature, chunk_tokens
        self.autocast, self.split, self.rank = autocast, split, rank
        self.layouts = tuple(k for k in LAYOUTS if k != "grouped" or grouped_mask_supported(model))
        self.checked: set[str] = set()
        self.attention_weight = attention_weight_of(model)  # for choosing between layouts by cost
        self.positions = [0, 0, 0]  # positions computed, tokens needed, batch tokens: see padding_metrics

    def forward(self, module: torch.nn.Module, batch: DataProto, sl: slice | torch.Tensor, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Response log-probs (and entropy), (rows, R), of rows ``sl`` of ``batch``; with gradient
        when ``module`` is in training mode and grad is enabled."""
        ids, attn, pos, resp = (batch[k][sl].to(self.device) for k in ("input_ids", "attention_mask", "position_ids", "responses"))
        packed = layout_rows(ids, attn, pos, resp.shape[1], self.layouts, self.attention_weight)
        while packed is not None and packed.kind not in self.checked:
            if self._layout_is_exact(module, packed, ids, attn, pos, resp):
                self.checked.add(packed.kind)
            else:
                self.layouts = tuple(k for k in self.layouts if k != packed.kind)
                packed = layout_rows(ids, attn, pos, resp.shape[1], self.layouts, self.attention_weight)
        with self.autocast():
            lp, ent, stats = forward_response_log_probs(module, ids, attn, pos, resp, self.temperature, with_entropy, packed, self.chunk_tokens)
        for i, n in enumerate((stats.computed, stats.needed, stats.batch)):
            self.positions[i] += n
        return lp, ent

    @torch.no_grad()
    def all_rows(self, model: torch.nn.Module, data: DataProto, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``forward`` over every micro-batch of ``data`` in eval mode, on CPU."""
        was_training = model.training
        model.eval()
        lps, ents = [], []
        for rows in self.split(data["attention_mask"]):
            lp, ent = self.forward(model, data, rows, with_entropy)
            lps.append(lp.cpu())
            if ent is not None:
                ents.append(ent.cpu())
        model.train(was_training)
        return torch.cat(lps), (torch.cat(ents) if ents else None)

    def padding_metrics(self) -> dict[str, float]:
        """``perf/padding_waste``: padded positions computed per needed token since the last call;
        ``perf/prompt_sharing``: the share of the batch's tokens not recomputed thanks to shared prompts."""
        computed, needed, batch = self.positions
        self.positions = [0, 0, 0]
        return {"perf/padding_waste": (computed - needed) / max(needed, 1), "perf/prompt_sharing": 1.0 - needed / max(batch, 1)}

    @torch.no_grad()
    def _layout_is_exact(self, module: torch.nn.Module, packed: Any, ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor, resp: torch.Tensor) -> bool:
        """Once per layout: does it give this model's padded log-probs?"""
        was_training = module.training
        module.eval()
        try:
            with self.autocast():
                laid_out, _, _ = forward_response_log_probs(module, ids, attn, pos, resp, self.temperature, False, packed, self.chunk_tokens)
                padded, _, _ = forward_response_log_probs(module, ids, attn, pos, resp, self.temperature, False, None, self.chunk_tokens)
        finally:
            module.train(was_training)
        R = resp.shape[1]
        valid = (attn[:, -R:] * attn[:, -R - 1 : -1]).bool()
        diff = float((laid_out - padded)[valid].abs().mean()) if valid.any() else 0.0
        tolerance = 1e-4 if self.compute_dtype == torch.float32 else 2e-2  # rounding of other matmul shapes
        if diff > tolerance:
            warnings.warn(f"actor rank {self.rank}: the {packed.kind} layout changes this model's log-probs (mean |diff| {diff:.2e} > {tolerance:.0e}); "
                          "not using it", stacklevel=2)
        return diff <= tolerance
