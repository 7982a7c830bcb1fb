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
from typing import Callable, ContextManager

import torch

from armor_core.dataproto.protocol import DataProto
from armor_core.models.routing_replay import ROUTES, layout_routes, replaying
from armor_core.ops.sampling_replay import KEPT_IDS, replayed
from armor_core.workers.forward.layouts import (
    LAYOUTS,
    LayoutStats,
    attention_weight_of,
    forward_response_log_probs,
    grouped_mask_supported,
    layout_rows,
)
from armor_core.workers.forward.packing import PackedRows
from armor_core.workers.parallel.collectives import equal_micro_batches

__all__ = ["LayoutChoice", "ResponseLogProbs"]


class LayoutChoice:
    """The layouts a model may use: each kind is compared once with the padded forward (the mean
    absolute difference on valid response positions) and dropped, with a warning naming ``who``,
    when it changes the result beyond rounding.

    :param model: the module whose layouts are offered (``grouped`` needs a 4D-mask-capable model).
    :param check_module: the module a layout is checked on: one whose forward is no collective (not
        a DDP wrapper, not FSDP2 shards), since only this rank runs the check; or, with ``collective`` > 1,
        FSDP2 shards whose every forward is a collective over that many ranks: then the ranks check together
        (``_check_together``), so each runs as many forwards and all keep or drop a layout alike.
    :param autocast: ``autocast()`` context for the compute dtype.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        check_module: torch.nn.Module,
        compute_dtype: torch.dtype,
        autocast: Callable[[], ContextManager],
        who: str,
        quantity: str,
        collective: int = 1,
    ) -> None:
        self.check_module, self.autocast, self.who, self.quantity = check_module, autocast, who, quantity
        self.collective = collective
        self.layouts = tuple(k for k in LAYOUTS if k != "grouped" or grouped_mask_supported(model))
        self.checked: set[str] = set()
        self.attention_weight = attention_weight_of(model)  # for choosing between layouts by cost
        self.tolerance = 1e-4 if compute_dtype == torch.float32 else 2e-2  # rounding of other matmul shapes
        self.positions = [0, 0, 0]  # positions computed, tokens needed, batch tokens: see padding_metrics

    def choose(
        self,
        ids: torch.Tensor,
        attn: torch.Tensor,
        pos: torch.Tensor,
        response_length: int,
        run: Callable[[torch.nn.Module, PackedRows | None], torch.Tensor],
    ) -> PackedRows | None:
        """The layout of one micro-batch, or None for the padded forward. ``run(module, layout)``
        computes the (bs, R) result in a layout (None: padded), to compare a new layout with."""
        if self.collective > 1:
            self._check_together(ids, attn, pos, response_length, run)
            return layout_rows(ids, attn, pos, response_length, self.layouts, self.attention_weight)
        packed = layout_rows(ids, attn, pos, response_length, self.layouts, self.attention_weight)
        while packed is not None and packed.kind not in self.checked:
            self._judge(packed.kind, self._difference(run, packed, attn, response_length))
            if packed.kind in self.checked:
                break
            packed = layout_rows(ids, attn, pos, response_length, self.layouts, self.attention_weight)
        return packed

    def _judge(self, kind: str, diff: float) -> None:
        """Keep ``kind`` (checked) when ``diff`` is rounding, else drop it with a warning."""
        if diff <= self.tolerance:
            self.checked.add(kind)
            return
        warnings.warn(
            f"{self.who}: the {kind} layout changes this model's {self.quantity} (mean |diff| {diff:.2e} > "
            f"{self.tolerance:.0e}); not using it",
            stacklevel=4,
        )
        self.layouts = tuple(k for k in self.layouts if k != kind)

    def _check_together(
        self,
        ids: torch.Tensor,
        attn: torch.Tensor,
        pos: torch.Tensor,
        response_length: int,
        run: Callable[[torch.nn.Module, PackedRows | None], torch.Tensor],
    ) -> None:
        """The ranks' check of the layouts none has checked yet, on their own micro-batches, every rank calling
        this as often (one call per micro-batch, stand-ins included). A kind is checked when any rank's
        micro-batch can be laid out in it: each rank then runs two forwards (that layout and the padded one; a rank
        whose rows cannot, the padded one twice) and all take the largest difference, so the layouts left, and
        what each rank checks next, stay the same on every rank."""
        import torch.distributed as dist

        from armor_core.workers.parallel.strategy import reshard

        pending = [kind for kind in self.layouts if kind not in self.checked]
        if not pending:
            return
        mine = {kind: layout_rows(ids, attn, pos, response_length, (kind,), self.attention_weight) for kind in pending}
        wanted = torch.tensor([float(mine[kind] is not None) for kind in pending], dtype=torch.float64)
        dist.all_reduce(wanted, op=dist.ReduceOp.MAX)
        for kind, want in zip(pending, wanted.tolist()):
            if want:
                diff = torch.tensor([self._difference(run, mine[kind], attn, response_length)], dtype=torch.float64)
                dist.all_reduce(diff, op=dist.ReduceOp.MAX)
                self._judge(kind, float(diff))
        reshard(self.check_module)  # a forward without backward leaves FSDP2's root parameters gathered

    @torch.no_grad()
    def _difference(
        self,
        run: Callable[[torch.nn.Module, PackedRows | None], torch.Tensor],
        packed: PackedRows | None,
        attn: torch.Tensor,
        R: int,
    ) -> float:
        """Mean |result in ``packed`` - padded result| on valid response positions, the check module in eval mode
        (``packed`` None: the padded forward twice, a stand-in in a collective check, 0)."""
        module = self.check_module
        was_training = module.training
        module.eval()
        try:
            with self.autocast():
                diff = (run(module, packed) - run(module, None)).float()
        finally:
            module.train(was_training)
        valid = valid_response_positions(attn, R)
        return float(diff[valid].abs().mean()) if valid.any() else 0.0

    def count(self, stats: LayoutStats) -> None:
        for i, n in enumerate((stats.computed, stats.needed, stats.batch)):
            self.positions[i] += n

    def padding_metrics(self, prefix: str = "perf/") -> dict[str, float]:
        """``perf/padding_waste``: padded positions computed per needed token since the last call;
        ``perf/prompt_sharing``: the share of the batch's tokens not recomputed thanks to shared prompts."""
        computed, needed, batch = self.positions
        self.positions = [0, 0, 0]
        return {
            f"{prefix}padding_waste": (computed - needed) / max(needed, 1),
            f"{prefix}prompt_sharing": 1.0 - needed / max(batch, 1),
        }


def valid_response_positions(attn: torch.Tensor, response_length: int) -> torch.Tensor:
    """(bs, R) bool: response tokens that are real and follow a real token (the positions every layout computes)."""
    R = response_length
    return (attn[:, -R:] * attn[:, -R - 1 : -1]).bool()


class ResponseLogProbs(LayoutChoice):
    """:param model: the module whose layouts are offered (``grouped`` needs a 4D-mask-capable model).
    :param autocast: ``autocast(enabled=default)`` context for the compute dtype.
    :param split: row positions of each micro-batch, from an attention mask."""

    def __init__(
        self,
        model: torch.nn.Module,
        check_module: torch.nn.Module,
        device: torch.device,
        compute_dtype: torch.dtype,
        temperature: float,
        chunk_tokens: int,
        autocast: Callable[[], ContextManager],
        split: Callable[[torch.Tensor], list[torch.Tensor]],
        rank: int = 0,
    ) -> None:
        super().__init__(model, check_module, compute_dtype, autocast, f"actor rank {rank}", "log-probs")
        self.device, self.compute_dtype, self.temperature, self.chunk_tokens = (
            device,
            compute_dtype,
            temperature,
            chunk_tokens,
        )
        self.split, self.rank = split, rank

    def forward(
        self,
        module: torch.nn.Module,
        batch: DataProto,
        sl: slice | torch.Tensor,
        with_entropy: bool,
        extra_ids: torch.Tensor | None = None,
        count: bool = True,
        routes: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Response log-probs (and entropy), (rows, R), of rows ``sl`` of ``batch``; with gradient
        when ``module`` is in training mode and grad is enabled. ``extra_ids`` (rows, R, k): also the
        log-probs of these tokens at each response position, from the same forward (one forward per
        micro-batch, as DDP and FSDP2 need); the log-probs are then (rows, R, 1 + k), column 0 the
        sampled tokens'. Rows carrying the rollout's kept sets (``rollout_kept_ids``) get the sampled tokens'
        log-probs over those sets (``armor_core.ops.sampling_replay``). ``count=False`` leaves it out of
        ``perf/padding_waste`` and ``perf/prompt_sharing`` (a measurement, not the training forward those describe).
        Rows carrying the rollout's routing (``rollout_routed_experts``, ``rollout.routing_replay``) are routed to the
        same experts (``armor_core.models.routing_replay``) unless ``routes`` is False (another model's forward: the
        reference, a teacher)."""
        ids, attn, pos, resp = (
            batch[k][sl].to(self.device) for k in ("input_ids", "attention_mask", "position_ids", "responses")
        )
        kept = batch[KEPT_IDS][sl].to(self.device) if KEPT_IDS in batch else None
        columns = [resp[..., None]]
        if extra_ids is not None:
            columns.append(extra_ids.to(self.device).long())
        if kept is not None:  # sampling-mask replay: the kept sets' log-probs, from the same forward
            columns.append(kept.long().clamp(min=0))
        targets = resp if len(columns) == 1 else torch.cat(columns, -1)
        packed = self.choose(
            ids,
            attn,
            pos,
            resp.shape[1],
            lambda m, p: forward_response_log_probs(
                m, ids, attn, pos, resp, self.temperature, False, p, self.chunk_tokens
            )[0],
        )
        chosen = batch[ROUTES][sl] if routes and ROUTES in batch else None
        if chosen is not None:
            chosen = layout_routes(chosen.to(self.device), None if packed is None else packed.source)
        with self.autocast(), replaying(module, chosen):
            lp, ent, stats = forward_response_log_probs(
                module, ids, attn, pos, targets, self.temperature, with_entropy, packed, self.chunk_tokens
            )
        if count:
            self.count(stats)
        if kept is not None:
            k = kept.shape[-1]
            sampled = replayed(lp[..., 0], lp[..., -k:], kept)
            lp = sampled if extra_ids is None else torch.cat([sampled[..., None], lp[..., 1:-k]], -1)
        return lp, ent

    @torch.no_grad()
    def all_rows(
        self, model: torch.nn.Module, data: DataProto, with_entropy: bool, world_size: int = 1, routes: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``forward`` over every micro-batch of ``data`` in eval mode, on CPU (``routes``: see ``forward``).

        :param world_size: > 1 when ``model``'s forward is a collective (FSDP2 shards): every rank
            then runs as many forwards as the rank with the most micro-batches (stand-ins, discarded).
        """
        was_training = model.training
        model.eval()
        lps, ents = [], []
        for rows, weight in equal_micro_batches(
            [(rows, 1.0) for rows in self.split(data["attention_mask"])], world_size
        ):
            lp, ent = self.forward(model, data, rows, with_entropy, routes=routes)
            if not weight:  # a stand-in
                continue
            lps.append(lp.cpu())
            if ent is not None:
                ents.append(ent.cpu())
        model.train(was_training)
        return torch.cat(lps), (torch.cat(ents) if ents else None)
