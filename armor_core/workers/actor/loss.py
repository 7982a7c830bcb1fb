"""The actor's loss: ``_accumulate``, forward and backward over a mini-batch's micro-batches, each micro-batch's
share of the mini-batch loss (``_micro_loss``: the policy-loss plugin's per-token loss (``_policy_loss``, with the
rollout-correction weights), the entropy bonus, the KL loss and the distillation loss, aggregated by the
loss-aggregation plugin over the mini-batch's global counts), and which rows need a forward at all.

``ActorWorker`` (``workers/actor/worker.py``) takes these methods from ``ActorLoss``, as it takes the optimizer
step from ``GuardedStep``; they read the worker's config, plugins, model, optimizer, log-prob pass and probe.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from armor_core.dataproto.protocol import DataProto
from armor_core.interfaces import call_with_params
from armor_core.workers.actor.policy_shift import PolicyShiftProbe
from armor_core.workers.common import add_metric, micro_batches, scalar
from armor_core.workers.losses.kl_loss import compute_kl_loss
from armor_core.workers.losses.rollout_correction import correction_weights
from armor_core.workers.parallel.collectives import equal_micro_batches, global_counts, mismatch_stats

if TYPE_CHECKING:
    from armor_core.config.schema import ArmorConfig
    from armor_core.interfaces import KLEstimator, LossAggregation, PolicyLoss
    from armor_core.workers.forward.logprobs import ResponseLogProbs
    from armor_core.workers.losses.distill_loss import DistillLoss

__all__ = ["ActorLoss"]


class ActorLoss:
    """The loss of ``ActorWorker``'s update, micro-batch by micro-batch."""

    cfg: ArmorConfig
    device: torch.device
    world_size: int
    policy_loss: PolicyLoss
    loss_agg: LossAggregation
    kl_loss: KLEstimator | None
    distill_loss: DistillLoss | None
    logp: ResponseLogProbs
    probe: PolicyShiftProbe
    model: torch.nn.Module
    train_module: torch.nn.Module
    zero_adv_inert: bool
    _seconds: dict[str, float]

    def _agg(self, mat: torch.Tensor, mask: torch.Tensor, n_tok: float, n_seq: float) -> torch.Tensor:
        a = self.cfg.actor
        norm = a.loss_norm_constant if a.loss_norm_constant is not None else float(self.cfg.rollout.max_new_tokens)
        return self.loss_agg.fn(mat, mask, global_num_tokens=n_tok, global_num_seqs=n_seq, norm_constant=norm)

    def _rows_with_gradient(self, mini: DataProto, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(rows to forward, rows left out or None). A row whose every advantage is 0 adds exactly
        nothing to the gradient when no other loss term reads it (``actor.skip_zero_advantage``); its
        tokens still count in the aggregation's global denominators, so the update is unchanged."""
        a = self.cfg.actor
        everything = torch.arange(len(mini))
        if not (
            a.skip_zero_advantage
            and self.zero_adv_inert
            and a.entropy_coeff == 0
            and self.kl_loss is None
            and self.distill_loss is None
            and "rollout_log_probs" in mini
        ):
            return everything, None
        live = ((mini["advantages"].to(self.device) != 0) & mask.bool()).any(-1).cpu()
        return everything[live], everything[~live]

    def _split(self, attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """Row positions of each micro-batch: ``actor.micro_batch_size`` rows, or by real tokens
        (``actor.max_tokens_per_micro_batch``)."""
        a = self.cfg.actor
        return micro_batches(
            attention_mask.sum(-1), a.micro_batch_size, a.max_tokens_per_micro_batch, "actor.max_tokens_per_micro_batch"
        )

    def _accumulate(
        self, mini: DataProto, on_policy: bool, first: bool, sums: dict[str, list[float]]
    ) -> dict[str, float]:
        """Forward and backward over ``mini``'s micro-batches (the caller zeroed the gradients); the gradients are
        left on the parameters. Returns this rank's parts of the mini-batch's loss terms (summed over ranks by
        ``_guarded_step``)."""
        mask_all = mini["response_mask"].to(self.device).float()
        counts = global_counts(mask_all, self.world_size)
        # each micro-batch's loss is its share of the mini-batch loss (global counts), so the
        # mini-batch's value is the sum over micro-batches and ranks, not a mean
        parts: dict[str, float] = dict.fromkeys(
            (
                "actor/pg_loss",
                "actor/entropy",
                *(("actor/kl_loss",) if self.kl_loss is not None else ()),
                *(("actor/distill_loss",) if self.distill_loss is not None else ()),
            ),
            0.0,
        )
        rows, skipped = self._rows_with_gradient(mini, mask_all)
        if skipped is not None:  # their entropy, estimated: E[-log p(sampled token)] is the entropy
            parts["actor/entropy"] += scalar(
                self._agg(-mini["rollout_log_probs"][skipped].to(self.device), mask_all[skipped], *counts)
            )
            add_metric(sums, "actor/zero_adv_rows", len(skipped) / max(len(mini), 1))
        t0 = time.perf_counter()
        micro = equal_micro_batches(
            [(rows[i], 1.0) for i in self._split(mini["attention_mask"][rows])], self.world_size
        )
        for idx, weight in micro:
            loss, pg_loss, ent_loss, extra_terms, pm_metrics = self._micro_loss(
                mini, idx, weight, mask_all[idx], counts, on_policy, first, sums
            )
            for k, v in extra_terms.items():
                parts[k] += v
            # DDP and FSDP2 average gradients over ranks; the aggregation already divides by global counts
            (loss * (self.world_size * weight)).backward()
            if not weight:  # a stand-in that keeps this rank in step with the others' collectives
                continue
            parts["actor/pg_loss"] += scalar(pg_loss)
            parts["actor/entropy"] += scalar(ent_loss)
            for k, v in pm_metrics.items():
                add_metric(sums, k if k.startswith("rollout_correction/") else f"actor/{k}", v)
        if not micro:  # no row (on any rank) had a gradient: it is 0, and Adam's step still moves the weights
            for p in self.model.parameters():
                p.grad = torch.zeros_like(p)
        self._seconds["fwd_bwd"] += time.perf_counter() - t0
        return parts

    def _micro_loss(
        self,
        mini: DataProto,
        idx: torch.Tensor,
        weight: float,
        mask: torch.Tensor,
        counts: tuple[Any, Any],
        on_policy: bool,
        first: bool,
        sums: dict[str, list[float]],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float], dict[str, float]]:
        """One micro-batch's forward and its share of the mini-batch loss: ``(loss, pg_loss, entropy, the KL and
        distillation terms times ``weight``, the policy loss's metrics)``. ``counts``: the mini-batch's global token
        and sequence counts, which the aggregation divides by."""
        a = self.cfg.actor
        extra = self.distill_loss.extra_ids(mini, idx) if self.distill_loss is not None else None
        log_prob, entropy = self.logp.forward(self.train_module, mini, idx, with_entropy=True, extra_ids=extra)
        assert entropy is not None  # asked for with_entropy
        at_ids = None
        if extra is not None:  # the student's log-probs at the teacher's top-k ids, from the same forward
            log_prob, at_ids = log_prob[..., 0], log_prob[..., 1:]
        # exactly on-policy (one update per batch): the old policy *is* this forward, so the
        # ratio is 1 with the right gradient and the extra forward pass is skipped
        old = log_prob.detach() if on_policy else mini["old_log_probs"][idx].to(self.device)
        self.probe.keep(mini, idx, log_prob, mask, weight)
        if first and "rollout_log_probs" in mini:  # the rollout/train mismatch, measured for free
            for k, v in mismatch_stats(
                log_prob.detach(), mini["rollout_log_probs"][idx].to(self.device), mask * weight, self.world_size
            ).items():
                add_metric(sums, k, v)
        loss_mat, pm_metrics = self._policy_loss(mini, idx, log_prob, old, mask)
        pg_loss = self._agg(loss_mat, mask, *counts)
        ent_loss = self._agg(entropy, mask, *counts)
        loss = pg_loss - a.entropy_coeff * ent_loss
        terms: dict[str, float] = {}
        if self.kl_loss is not None:
            kl_mat, _ = compute_kl_loss(log_prob, mini["ref_log_prob"][idx].to(self.device), mask, 1.0, self.kl_loss)
            kl = self._agg(kl_mat, mask, *counts)
            loss = loss + a.kl_loss_coef * kl
            terms["actor/kl_loss"] = weight * scalar(kl)
        if self.distill_loss is not None:
            d_mat, _ = self.distill_loss(mini, idx, log_prob, mask, at_ids)
            distill = self._agg(d_mat, mask, *counts)
            loss = loss + self.distill_loss.coef * distill
            terms["actor/distill_loss"] = weight * scalar(distill)
        return loss, pg_loss, ent_loss, terms, pm_metrics

    def _policy_loss(
        self, mini: DataProto, idx: torch.Tensor, log_prob: torch.Tensor, old: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The policy-loss plugin's per-token loss and metrics, times the rollout-correction weights when the rows
        came from another policy than ``old`` (``algorithm.rollout_correction``)."""
        cfg, a = self.cfg, self.cfg.actor
        loss_mat, pm_metrics = call_with_params(
            self.policy_loss.fn,
            log_prob,
            old,
            mini["advantages"][idx].to(self.device),
            mask,
            available={
                "clip_ratio_low": a.clip_ratio_low,
                "clip_ratio_high": a.clip_ratio_high,
                "clip_ratio_c": a.clip_ratio_c,
            },
            extra=a.policy_loss_kwargs,
            where="actor.policy_loss_kwargs",
        )
        correction = cfg.algorithm.rollout_correction
        if correction != "none" and "rollout_log_probs" in mini:  # the rows came from another policy than `old`
            rollout = mini["rollout_log_probs"][idx].to(self.device)
            w, cm = correction_weights(old, rollout, mask, correction, cfg.algorithm.rollout_correction_cap)
            loss_mat = loss_mat * w
            pm_metrics = {**pm_metrics, **cm}
        return loss_mat, pm_metrics
