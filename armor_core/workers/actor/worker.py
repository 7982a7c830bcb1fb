"""The actor worker: policy + optimizer, the reference policy, and (colocated) the rollout engine.

One instance lives in each actor process (a Ray actor built by ``engine.WorkerGroup``). It builds
its own plugin manager, so every algorithm it runs is looked up by the name in the config, never
branched on: the policy loss, the loss aggregation, the KL estimator and the guards are all plugins.

Data parallelism: with ``world_size > 1`` the worker joins a torch.distributed group (gloo on CPU,
NCCL on GPU) and wraps the model in DDP or shards it with FSDP2 (``actor.strategy``, see
``workers/parallel/strategy.py``); the loss aggregation contract (sum of micro-batch losses
over ranks = full-batch loss, see ``hookspecs.armor_register_loss_aggregations``) is what makes
N workers equal one worker on the same global batch.

Three concerns live in bases of ``ActorWorker``: the weights leaving and returning (``ActorWeights``,
``workers/actor/weights.py``), the loss (``ActorLoss``, ``workers/actor/loss.py``: ``_accumulate``) and the
optimizer step under the guards (``GuardedStep``, ``workers/actor/guarded_step.py``). Here: set-up, generation,
log-probs and the update's loop over epochs and mini-batches (``update_actor``).
"""

from __future__ import annotations

import copy
import time
import warnings
from typing import TYPE_CHECKING, cast

import torch

from armor_core.config.schema import ArmorConfig, from_dict
from armor_core.dataproto.protocol import DataProto
from armor_core.interfaces import capability
from armor_core.models.lora import MergedView, adapters_off, apply_lora
from armor_core.models.moe import RouterWatch
from armor_core.workers.actor.guarded_step import GuardedStep
from armor_core.workers.actor.loss import ActorLoss
from armor_core.workers.actor.optim import adamw, zero_advantage_is_inert
from armor_core.workers.actor.policy_shift import PROBE_ROWS, PolicyShiftProbe
from armor_core.workers.actor.schedule import lr_factor
from armor_core.workers.actor.weights import ActorWeights
from armor_core.workers.common import (
    build_on_one_thread,
    isolate,
    iter_micro_batches,
    memory_metrics,
    quiet_transformers,
    reset_memory_peaks,
    seed_everything,
)
from armor_core.workers.forward.lm_head import install_response_head
from armor_core.workers.forward.logprobs import ResponseLogProbs
from armor_core.workers.losses.distill_loss import DistillLoss
from armor_core.workers.parallel.collectives import init_distributed
from armor_core.workers.parallel.precision import autocast, compute_dtype
from armor_core.workers.parallel.strategy import reshard
from armor_core.workers.rollback_point import RollbackPoints
from armor_core.workers.rollout.backend import build_rollout

if TYPE_CHECKING:
    from armor_core.plugins import PluginManager

__all__ = ["ActorWorker"]


class ActorWorker(ActorWeights, ActorLoss, GuardedStep):
    def __init__(
        self,
        config: dict,
        rank: int = 0,
        world_size: int = 1,
        run_dir: str | None = None,
        assignment: dict | None = None,
    ) -> None:
        from armor_core.plugins import get_plugin_manager

        self.cfg: ArmorConfig = from_dict(config)
        self.rank, self.world_size = rank, world_size
        cfg = self.cfg
        self.isolation = isolate(assignment, cfg, rank)
        built = build_on_one_thread()
        quiet_transformers()
        seed_everything(cfg.trainer.seed + rank, cfg.trainer.deterministic)
        self.device = torch.device(cfg.trainer.device)
        self.compute_dtype = compute_dtype(cfg.model.dtype, self.device)
        if world_size > 1 or cfg.actor.offload:  # offload shards with FSDP2 even on one rank
            init_distributed(self.device, self.rank, self.world_size)

        pm = get_plugin_manager()
        self._build_plugins(cfg, pm, run_dir)
        self._load_policy(cfg)
        self.distill_loss = DistillLoss.from_config(cfg)  # None unless distillation adds a loss
        self._build_training(cfg)
        self._build_rollout(cfg, pm)
        self.global_step = 0
        # one rank and DDP compute in model.dtype under autocast; FSDP2 casts through its MixedPrecisionPolicy
        self.autocast = lambda enabled=not self.sharded: autocast(self.device, self.compute_dtype, enabled)
        # layouts are checked on full weights, not a DDP wrapper or shards: a forward that is no collective
        self.logp = ResponseLogProbs(
            self.model,
            self.gen_model if self.sharded else self.model,
            self.device,
            self.compute_dtype,
            cfg.rollout.temperature,
            self.chunk_tokens,
            self.autocast,
            self._split,
            rank,
        )
        self.routers = RouterWatch(self.model)
        if self.sharded and not self.gen_copy:  # no full copy to check a layout on alone: the ranks check together
            self.logp.collective = self.world_size
        self.collective = self.world_size if self.sharded else 1  # a sharded forward is a collective: ranks run as many
        from collections import deque

        from armor_core.stability.faults import Faults

        self.faults = Faults(cfg.trainer.faults)
        stale = self.faults.any("stale_rollout")
        self._snapshots: deque = deque(maxlen=int(stale.value or 4) if stale else 0)
        self._published = None
        self.points = RollbackPoints()  # kept only when the driver asks (guard.rollback_every)
        if cfg.rollout.mode == "async":
            self._publish_policy()
        built()

    def _build_plugins(self, cfg: ArmorConfig, pm: PluginManager, run_dir: str | None) -> None:
        """The policy loss, the loss aggregation, the KL estimator of the KL loss, the guards (rank 0 keeps their
        events) and the probe of the policy's change a guard may need."""
        from armor_core.stability.guard import GuardRunner, run_coefficients

        self.policy_loss = pm.get("policy_loss", cfg.actor.policy_loss, where="actor.policy_loss")
        self.loss_agg = pm.get("loss_aggregation", cfg.actor.loss_agg_mode, where="actor.loss_agg_mode")
        self.kl_loss = (
            pm.get("kl_estimator", cfg.actor.kl_loss_type, where="actor.kl_loss_type")
            if cfg.actor.use_kl_loss
            else None
        )
        self.guard = GuardRunner(  # verdicts are collective: one record
            cfg.guard.guards,
            pm,
            run_dir if self.rank == 0 else None,
            enable=cfg.guard.enable,
            run_values=run_coefficients(cfg.actor),
        )
        self.watch_step = self.guard.watches("step")  # the stage costs a copy of the parameters per update
        # the policy's change per step costs a forward of a few rows: measured only for a guard that needs it
        self.probe = PolicyShiftProbe(PROBE_ROWS if self.guard.wants("policy_kl") else 0)
        self._judged_lr = 0.0  # the rate of the last step stage ``step`` judged (``GuardedStep._judges``)

    def _load_policy(self, cfg: ArmorConfig) -> None:
        """The policy in float32 master weights (LoRA adapters on it), its tokenizer, the chunked
        response head, and the frozen reference copy when a KL term needs one."""
        from armor_core.models.loading import load_model, load_tokenizer, resolve_model_path

        m, a = cfg.model, cfg.actor
        path = resolve_model_path(m.path)
        self.tokenizer = load_tokenizer(m.tokenizer_path or path, trust_remote_code=m.trust_remote_code)
        # master weights: float32 whatever model.dtype computes in
        self.model = load_model(path, "float32", trust_remote_code=m.trust_remote_code)
        if m.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )  # frozen inputs under LoRA
        self.lora = bool(m.lora_rank)
        if self.lora:
            self.model = apply_lora(
                self.model, m.lora_rank, m.lora_alpha, m.lora_dropout, m.lora_target_modules, cfg.trainer.seed
            )
        # transformers annotates PreTrainedModel.to through a decorator pyright reads as taking the model itself
        self.model = self.model.to(self.device)  # pyright: ignore[reportArgumentType]
        self.chunk_tokens = a.logprob_chunk_tokens
        why = (
            install_response_head(self.model) if self.chunk_tokens else None
        )  # before the copies below, so they have it too
        if why:
            warnings.warn(
                f"actor: actor.logprob_chunk_tokens={self.chunk_tokens} cannot apply: {why}; log-probs come from "
                "the full logits",
                stacklevel=2,
            )
            self.chunk_tokens = 0
        self.ref_model = None
        if (a.use_kl_loss or cfg.algorithm.use_kl_in_reward) and not self.lora:  # with LoRA: the adapters switched off
            # never trained: held in the compute dtype, half the memory in bf16 (PreTrainedModel.to's annotation: above)
            ref_model = copy.deepcopy(self.model).to(self.compute_dtype)  # pyright: ignore[reportArgumentType]
            self.ref_model = ref_model.eval().requires_grad_(False)

    def _build_training(self, cfg: ArmorConfig) -> None:
        """The data-parallel wrapper (DDP / FSDP2), the optimizer and the learning-rate schedule."""
        from armor_core.workers.parallel.strategy import ShardWriter, wrap

        a = cfg.actor
        # FSDP2 shards self.model in place and a sharded forward is a collective: the hf rollout generates from the
        # shards with every rank in step (actor.fsdp_generation=shards), an engine with weights of its own (vllm) is
        # synced from them a bucket at a time; the rest generates from a full copy, refreshed by sync_weights (see
        # workers/parallel/strategy.py)
        self.sharded = a.strategy == "fsdp2" and (self.world_size > 1 or a.offload)
        self.gen_copy = self.sharded and self._needs_copy(cfg)
        self.shard_writer = ShardWriter(self.world_size)
        self.gen_model = copy.deepcopy(self.model).eval().requires_grad_(False) if self.gen_copy else self.model
        self.train_module: torch.nn.Module = wrap(
            self.model, a.strategy, self.world_size, self.device, self.compute_dtype, a.offload
        )
        if (
            self.sharded and self.ref_model is not None
        ):  # sharded like the policy: 1/N of it per rank (its forward is then a collective)
            self.ref_model = wrap(self.ref_model, "fsdp2", self.world_size, self.device, self.compute_dtype, a.offload)
        self.optimizer = adamw(self.model, lr=a.lr, betas=tuple(a.betas), weight_decay=a.weight_decay)
        self.zero_adv_inert = zero_advantage_is_inert(self.policy_loss.fn, a)
        updates_per_step = a.ppo_epochs * (cfg.data.train_batch_size // a.ppo_mini_batch_size)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_factor(a.warmup_steps, a.lr_schedule, cfg.trainer.total_steps * updates_per_step)
        )

    def _build_rollout(self, cfg: ArmorConfig, pm: PluginManager) -> None:
        """The colocated rollout engine (``rollout.backend``), or none in async mode (rollout workers of their own
        generate)."""
        backend_cls = pm.get("rollout_backend", cfg.rollout.backend, where="rollout.backend")
        # an engine with its own weights takes the compute dtype and, with LoRA, either the PeftModel
        # (a backend that serves LoRA itself: vllm) or the base model's names with the adapters merged
        takes_peft = any(capability("rollout_backend", backend_cls, attr) for attr in ("shares_module", "serves_lora"))
        # a MergedView stands in for the base module: every attribute but state_dict is the base model's
        source = cast(torch.nn.Module, MergedView(self.gen_model)) if self.lora and not takes_peft else self.gen_model
        self.rollout = None
        if cfg.rollout.mode == "sync":
            with autocast(self.device, self.compute_dtype):
                self.rollout = build_rollout(backend_cls, source, self.tokenizer, cfg.rollout)
            if self.sharded and self._generates_from_shards(cfg):  # it runs the shards: each forward is a collective
                self.rollout.lockstep = self.world_size
            unchecked = capability("rollout_backend", self.rollout, "weight_sums") is None
            if cfg.rollout.verify_sync and self.needs_weight_sync() and unchecked and self.rank == 0:
                warnings.warn(
                    f"rollout.verify_sync: the {cfg.rollout.backend!r} rollout backend cannot report the weights it "
                    "holds (no weight_sums), so the weight syncs to it are not checked",
                    stacklevel=2,
                )

    def isolation_record(self) -> dict:
        return self.isolation

    def ping(self) -> dict:
        import os

        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "threads": torch.get_num_threads(),
            "params": sum(p.numel() for p in self.model.parameters()),
        }

    # -- rollout --------------------------------------------------------------------------------

    def generate(self, prompts: DataProto, greedy: bool = False, stale: bool = False) -> DataProto:
        t0 = time.perf_counter()
        out = self._generate(prompts, greedy, stale)
        # the seconds spent in here: the driver's wall time minus this is Ray and serialisation
        out.meta_info["metrics"] = {**out.meta_info.get("metrics", {}), "perf/worker_s": time.perf_counter() - t0}
        return out

    def _generate(self, prompts: DataProto, greedy: bool, stale: bool) -> DataProto:
        if stale and self._snapshots:  # fault injection: sample from old weights, then put the current ones back
            current = {k: v.clone() for k, v in self.gen_model.state_dict().items()}
            self.gen_model.load_state_dict(self._snapshots[0])
            try:
                with self.autocast(True):
                    return self.rollout.generate(prompts.to(self.device), greedy=greedy).to("cpu")
            finally:
                self.gen_model.load_state_dict(current)
        try:
            with self.autocast(True):  # the full copy a sharded worker generates from is float32 too
                return self.rollout.generate(prompts.to(self.device), greedy=greedy).to("cpu")
        finally:
            if self.sharded and not self.gen_copy:
                reshard(self.model)  # FSDP2 leaves the root's parameters (embedding, head) gathered after a forward

    # -- log-probs ------------------------------------------------------------------------------

    def compute_log_prob(self, data: DataProto) -> DataProto:
        t0 = time.perf_counter()
        lp, ent = self.logp.all_rows(self.model, data, with_entropy=True, world_size=self.collective)
        mask = data["response_mask"]
        return DataProto.from_dict(
            tensors={"old_log_probs": lp * mask, "entropys": ent * mask},
            meta_info={"metrics": {**self.logp.padding_metrics(), "perf/worker_s": time.perf_counter() - t0}},
        )

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        t0 = time.perf_counter()
        if self.lora:  # the reference policy is the base model: the same module with its adapters off
            with adapters_off(self.model):
                lp, _ = self.logp.all_rows(
                    self.model, data, with_entropy=False, world_size=self.collective, routes=False
                )
        elif self.ref_model is None:
            raise RuntimeError("no reference model: set actor.use_kl_loss or algorithm.use_kl_in_reward")
        else:
            # the reference routes by its own weights: replaying the policy's routing would compare two policies'
            lp, _ = self.logp.all_rows(
                self.ref_model, data, with_entropy=False, world_size=self.collective, routes=False
            )
        return DataProto.from_dict(
            tensors={"ref_log_prob": lp * data["response_mask"]},
            meta_info={"metrics": {**self.logp.padding_metrics(), "perf/worker_s": time.perf_counter() - t0}},
        )

    # -- update ---------------------------------------------------------------------------------

    def update_actor(self, data: DataProto, step: int) -> dict[str, float]:
        """PPO-style update on this rank's share of the batch; returns metrics (means over
        mini-batches). Each mini-batch: ``_accumulate`` (forward/backward over micro-batches), then
        ``_guarded_step`` (clip, guard, optimizer step)."""
        kill = self.faults.at("kill_worker", step)
        if kill is not None and self.rank == int(kill.value or 0):  # fault injection: die as the OOM killer would
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        cfg, a = self.cfg, self.cfg.actor
        t_call = time.perf_counter()
        reset_memory_peaks(self.device)
        self._seconds = {"fwd_bwd": 0.0, "optimizer": 0.0, "probe": 0.0}
        self.logp.positions = [0, 0, 0]
        self.train_module.train()
        n_rows = len(data)
        rows_per_mini = max(1, n_rows * a.ppo_mini_batch_size // cfg.data.train_batch_size)
        sums: dict[str, list[float]] = {}
        if self._snapshots.maxlen:
            self._snapshots.append({k: v.detach().clone() for k, v in self.gen_model.state_dict().items()})
        first = True  # before the first optimizer step: the weights the rollout sampled with
        gen = torch.Generator().manual_seed(cfg.trainer.seed * 1000003 + step)
        for _ in range(a.ppo_epochs):
            order = (
                torch.randperm(n_rows, generator=gen)
                if a.ppo_epochs > 1 or rows_per_mini < n_rows
                else torch.arange(n_rows)
            )
            for mini_sl in iter_micro_batches(n_rows, rows_per_mini):
                mini = data[order[mini_sl].numpy()]  # rows as an array: a DataProto (a 0-d tensor would be a row)
                self.optimizer.zero_grad(set_to_none=True)
                with self.routers.watch():  # an MoE model's expert load in the training forward (models/moe.py)
                    parts = self._accumulate(mini, "old_log_probs" not in data, first, sums)
                self._guarded_step(parts, step, first, sums)
                first = False
        self.global_step = step
        return self._update_metrics(sums, t_call)

    def _update_metrics(self, sums: dict[str, list[float]], t_call: float) -> dict[str, float]:
        """``update_actor``'s metrics from the sums over its mini-batches, with the guard's, the layouts', memory and
        the seconds spent (the policy published for async rollout first)."""
        cfg = self.cfg
        # extremes stay extremes: averaging a max over micro-batches would hide the spike a guard watches
        reduce = {"max": max, "min": min}
        metrics = {
            k: reduce[k.rsplit("_", 1)[-1]](v) if k.endswith(("_max", "_min")) else sum(v) / len(v)
            for k, v in sums.items()
        }
        # the rate the update's optimizer steps used (their mean, from _guarded_step); when a guard skipped every
        # one of them, the rate they would have used
        metrics.setdefault("actor/lr", self.optimizer.param_groups[0]["lr"])
        metrics.update(self.guard.pop_metrics())
        metrics.update(self.logp.padding_metrics())
        metrics.update(self.routers.metrics())
        metrics.update(memory_metrics(self.device))
        if cfg.rollout.mode == "async":
            t0 = time.perf_counter()
            self._publish_policy()
            metrics["perf/publish_s"] = time.perf_counter() - t0
        # seconds inside this call, so the driver can separate Ray and serialisation from the work
        metrics.update(
            {
                "perf/actor_fwd_bwd_s": self._seconds["fwd_bwd"],
                "perf/actor_optimizer_s": self._seconds["optimizer"],
                **({"perf/actor_probe_s": self._seconds["probe"]} if self.probe.rows else {}),
                "perf/worker_s": time.perf_counter() - t_call,
            }
        )
        return metrics

    def update_then_generate(
        self, data: DataProto, prompts: DataProto, step: int, stale: bool = False
    ) -> tuple[dict[str, float], DataProto]:
        """``update_actor(data, step)``, the weight sync if the rollout engine needs one, then
        ``generate(prompts)`` for the next step: the calls the driver would make one after the other,
        in one round trip. ``perf/sync_s`` in the metrics is the sync's seconds."""
        metrics = self.update_actor(data, step)
        if self.needs_weight_sync():
            sync = self.sync_weights()
            metrics["perf/sync_s"] = sync.pop("perf/worker_s")
            metrics.update(sync)
        else:
            metrics["perf/sync_s"] = 0.0
        return metrics, self.generate(prompts, stale=stale)
