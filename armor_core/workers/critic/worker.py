"""The critic worker (built only when the advantage estimator declares ``requires_critic``).

The value model (``values.ValueModel``) is the policy's backbone (a copy of the same pretrained
weights) with a scalar head: ``V(s_t)`` for each response position, read from the hidden state that
predicts token t, the same positions the actor reads its log-probs from, and computed in the same
layouts (``values.ResponseValues``: packed rows, shared prompts once; ``critic/padding_waste``).
The head starts at zero so the first advantages are the plain returns rather than noise from a
random head. ``model.gradient_checkpointing`` applies to the critic's backbone too.

Data parallelism follows the actor (``workers/parallel/strategy.py``): ``critic.num_workers`` ranks, DDP or
FSDP2 as ``actor.strategy`` says, value-loss token/sequence counts summed over ranks and the loss
scaled by the world size, so N ranks take the same step as one on the same batch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from armor_core.config.schema import ArmorConfig, from_dict
from armor_core.dataproto.protocol import DataProto
from armor_core.ops.masked import masked_mean
from armor_core.storage.state_io import load_checkpoint_state, save_state
from armor_core.workers.common import (
    build_on_one_thread,
    isolate,
    micro_batches,
    quiet_transformers,
    scalar,
    seed_everything,
)
from armor_core.workers.critic.values import ResponseValues, ValueModel
from armor_core.workers.parallel.collectives import agreed_norm, equal_micro_batches, global_counts, init_distributed
from armor_core.workers.parallel.precision import autocast, compute_dtype
from armor_core.workers.rollback_point import RollbackPoints, point_bytes

__all__ = ["CRITIC_SHARDS", "CriticWorker", "ValueModel", "value_loss"]

CRITIC_SHARDS = "critic_shards"  # a sharded checkpoint's value model and optimizer tensors


def value_loss(
    vpreds: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Clipped value loss of the PPO critic (Schulman et al. 2017; as in OpenAI baselines ppo2).

    ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)`` per token: the critic may
    not move further than ``c`` from the values it had when the rollout was scored, unless that
    move *reduces* the loss.

    :param vpreds: (bs, T) current critic values (differentiable).
    :param values: (bs, T) the critic's values at rollout time (old values).
    :param returns: (bs, T) targets from the advantage estimator.
    :param cliprange_value: ``critic.cliprange_value``.
    :returns: ``(loss_mat (bs, T), metrics)``; ``loss_mat`` is 0 outside the mask and not
        aggregated. Metrics: ``vf_clipfrac`` (fraction of valid tokens where the clipped term is
        the larger one), ``vpred_mean``.
    """
    m = response_mask.bool()
    zero = torch.zeros((), dtype=vpreds.dtype, device=vpreds.device)
    # sanitise padded positions first so a NaN there cannot reach the gradient through where()
    vpreds = torch.where(m, vpreds, zero)
    values = torch.where(m, values, zero).detach()
    returns = torch.where(m, returns, zero).detach()
    vclipped = values + (vpreds - values).clamp(-cliprange_value, cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (vclipped - returns) ** 2
    loss_mat = torch.where(m, 0.5 * torch.maximum(loss_unclipped, loss_clipped), zero)
    metrics = {
        "vf_clipfrac": masked_mean((loss_clipped > loss_unclipped).to(vpreds.dtype), m).detach(),
        "vpred_mean": masked_mean(vpreds, m).detach(),
    }
    return loss_mat, metrics


class CriticWorker:
    def __init__(self, config: dict, rank: int = 0, world_size: int = 1, assignment: dict | None = None) -> None:
        from transformers import AutoModel

        from armor_core.models.loading import resolve_model_path
        from armor_core.models.remote_code import check_remote_code
        from armor_core.plugins import get_plugin_manager
        from armor_core.workers.parallel.strategy import ShardWriter, wrap

        self.cfg: ArmorConfig = from_dict(config)
        cfg = self.cfg
        self.rank, self.world_size = rank, world_size
        self.isolation = isolate(assignment, cfg, rank)
        built = build_on_one_thread()
        quiet_transformers()
        seed_everything(cfg.trainer.seed + 7919 + rank, cfg.trainer.deterministic)
        self.device = torch.device(cfg.trainer.device)
        self.compute_dtype = compute_dtype(cfg.model.dtype, self.device)
        if world_size > 1:
            init_distributed(self.device, rank, world_size)
        path = resolve_model_path(cfg.model.path)
        check_remote_code(path, cfg.model.trust_remote_code)
        backbone = AutoModel.from_pretrained(  # master weights, as the actor's
            str(path), local_files_only=True, dtype=torch.float32, trust_remote_code=cfg.model.trust_remote_code
        )
        if cfg.model.gradient_checkpointing:
            backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = ValueModel(backbone, backbone.config.hidden_size).to(self.device)
        self.train_module = wrap(self.model, cfg.actor.strategy, world_size, self.device, self.compute_dtype)
        self.sharded = sharded = world_size > 1 and cfg.actor.strategy == "fsdp2"
        self.autocast = lambda: autocast(self.device, self.compute_dtype, enabled=not sharded)
        self.shard_writer = ShardWriter(world_size)
        self.values = ResponseValues(
            self.model, self.device, self.compute_dtype, self.autocast, rank, world_size if sharded else 1
        )
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.critic.lr)
        self.points = RollbackPoints()  # kept only when the driver asks (guard.rollback_every)
        self.loss_agg = get_plugin_manager().get(
            "loss_aggregation", cfg.actor.loss_agg_mode, where="actor.loss_agg_mode"
        )
        built()

    def isolation_record(self) -> dict:
        return self.isolation

    def ping(self) -> dict:
        import os

        return {"rank": self.rank, "pid": os.getpid(), "params": sum(p.numel() for p in self.model.parameters())}

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> DataProto:
        self.model.eval()
        R = data["responses"].shape[1]
        vals = []
        # a sharded forward is a collective: every rank runs as many as the rank with the most micro-batches
        for sl, weight in equal_micro_batches(
            [(sl, 1.0) for sl in self._split(data["attention_mask"])], self.world_size if self.sharded else 1
        ):
            values = self._values(data, sl, R).cpu()
            if weight:  # not a stand-in
                vals.append(values)
        return DataProto.from_dict(tensors={"values": torch.cat(vals) * data["response_mask"]})

    def _split(self, attention_mask: torch.Tensor) -> list[torch.Tensor]:
        c = self.cfg.critic
        budget, key = (
            (c.max_tokens_per_micro_batch, "critic.max_tokens_per_micro_batch")
            if c.max_tokens_per_micro_batch
            else (self.cfg.actor.max_tokens_per_micro_batch, "actor.max_tokens_per_micro_batch")
        )
        return micro_batches(attention_mask.sum(-1), c.micro_batch_size, budget, key)

    def _values(self, data: DataProto, rows: torch.Tensor, response_length: int) -> torch.Tensor:
        """V(s_t), (rows, R) float32, for ``rows`` of ``data`` (in the layout ``self.values`` chooses)."""
        return self.values.forward(self.train_module, data, rows, response_length)

    def update_critic(self, data: DataProto, step: int) -> dict[str, float]:
        c = self.cfg.critic
        self.model.train()
        R = data["responses"].shape[1]
        mask_all = data["response_mask"].float()
        n_tok, n_seq = global_counts(mask_all, self.world_size)  # the aggregation divides by the whole batch's counts
        sums: dict[str, list[float]] = {}
        self.values.positions = [0, 0, 0]  # the update's own forwards, not compute_values'
        for _ in range(c.ppo_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            # every rank runs as many backward passes as the others (token budgets can split ranks' shares unevenly)
            for sl, weight in equal_micro_batches(
                [(sl, 1.0) for sl in self._split(data["attention_mask"])], self.world_size
            ):
                mask = mask_all[sl].to(self.device)
                vpreds = self._values(data, sl, R)
                loss_mat, m = value_loss(
                    vpreds,
                    data["values"][sl].to(self.device),
                    data["returns"][sl].to(self.device),
                    mask,
                    c.cliprange_value,
                )
                loss = self.loss_agg.fn(
                    loss_mat, mask, global_num_tokens=n_tok, global_num_seqs=n_seq, norm_constant=float(R)
                )
                (loss * (self.world_size * weight)).backward()  # DDP and FSDP2 average gradients over ranks
                if not weight:  # a stand-in
                    continue
                sums.setdefault("critic/vf_loss", []).append(scalar(loss))
                for k, v in m.items():
                    sums.setdefault(f"critic/{k}", []).append(scalar(v))
            gn = torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), c.grad_clip if c.grad_clip > 0 else float("inf")
            )
            gn = agreed_norm(
                scalar(gn), self.world_size, self.cfg.actor.strategy == "fsdp2"
            )  # every rank steps or none
            sums.setdefault("critic/grad_norm", []).append(gn)
            if math.isfinite(gn):
                self.optimizer.step()
        return {**{k: sum(v) / len(v) for k, v in sums.items()}, **self.values.padding_metrics(prefix="critic/")}

    def save_checkpoint(self, path: str, background: bool = False) -> None:
        """The value model and its optimizer state (by parameter name): gathered to rank 0, or each rank's shards in
        ``critic_shards/`` (``actor.checkpoint_format``; with ``background`` written from a thread, ``wait_saved``);
        any world size resumes either."""
        from safetensors.torch import save_file

        from armor_core.workers.parallel.strategy import full_model_state, full_optimizer_state, writes_shards

        p = Path(path)
        p.mkdir(parents=True, exist_ok=True)  # the shards may be written from a thread: the directory is made here
        if writes_shards(self.cfg.actor.checkpoint_format, self.sharded, False):
            optim = self.shard_writer.save(self.model, self.optimizer, str(p / CRITIC_SHARDS), background)
            if self.rank == 0:
                save_state({"optimizer": optim}, p / "critic_state")
            return
        self.shard_writer.wait()
        model, optim = full_model_state(self.model), full_optimizer_state(self.model, self.optimizer)
        if self.rank == 0:
            save_file({k: v.contiguous() for k, v in model.items()}, str(p / "critic.safetensors"))
            save_state({"optimizer": optim}, p / "critic_state")

    def wait_saved(self) -> float:
        """Wait for a checkpoint's shards still being written in the background; the seconds waited."""
        return self.shard_writer.wait()

    def load_checkpoint(self, path: str, rollback: bool = False) -> None:
        """The value model and its optimizer state; ``rollback`` changes nothing here (no guard adjusts the critic's
        learning rate, and the critic runs no guards)."""
        from safetensors.torch import load_file

        from armor_core.workers.parallel.strategy import load_full_model_state, load_full_optimizer_state, load_shards

        self.shard_writer.wait()
        p = Path(path)
        # or an older checkpoint's critic_state.pt, if the user allows it
        state = load_checkpoint_state(p / "critic_state", allow_legacy_pt=self.cfg.trainer.allow_legacy_pt_state)
        if (p / CRITIC_SHARDS).is_dir():
            load_shards(self.model, self.optimizer, str(p / CRITIC_SHARDS), self.world_size, state["optimizer"])
            return
        missing, unexpected = load_full_model_state(self.model, load_file(str(p / "critic.safetensors")))
        if missing or unexpected:
            raise RuntimeError(
                f"critic checkpoint {p / 'critic.safetensors'} does not match the value model: missing "
                f"{missing[:5]}, unexpected {unexpected[:5]}"
            )
        load_full_optimizer_state(self.model, self.optimizer, state["optimizer"])

    def rollback_point_bytes(self) -> int:
        return point_bytes(self.optimizer)

    def keep_rollback_point(self, step: int, keep: list[int]) -> dict[str, float]:
        return self.points.keep(step, keep, self.optimizer, None, 0)

    def restore_rollback_point(self, step: int) -> None:
        self.points.restore(step, self.optimizer, None)
