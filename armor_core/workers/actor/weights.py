"""The actor's weights leaving its process and coming back: to the colocated rollout engine
(``sync_weights``), to rollout workers of their own (``policy_state``, ``rollout.mode=async``), into
a checkpoint and out of one, into a rollback point in memory and out of it (``workers/rollback_point.py``).
``ActorWorker`` (``workers/actor/worker.py``) takes these methods from ``ActorWeights``; they read the worker's
model, optimizer, scheduler, tokenizer, guard and rollback points.
"""

from __future__ import annotations

import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, cast

import torch

from armor_core.interfaces import capability
from armor_core.models.lora import (
    ADAPTER_DIR,
    MergedView,
    check_resume,
    load_adapter_state,
    merged_weights,
    save_adapter,
    write_base_manifest,
)
from armor_core.models.weight_sums import check_sync, sampled
from armor_core.storage.state_io import load_checkpoint_state, save_state
from armor_core.workers.rollback_point import RollbackPoints, point_bytes, rates_kept

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from armor_core.config.schema import ArmorConfig
    from armor_core.stability.faults import Faults
    from armor_core.stability.guard import GuardRunner
    from armor_core.workers.parallel.strategy import ShardWriter

__all__ = ["ACTOR_SHARDS", "MODEL_CONFIG", "ActorWeights"]

ACTOR_SHARDS = "actor_shards"  # a sharded checkpoint's model and optimizer tensors (torch.distributed.checkpoint)
MODEL_CONFIG = "model_config"  # beside them: the model's config and tokenizer, all `armor export` needs besides


class ActorWeights:
    """Weight hand-off and checkpoints of ``ActorWorker``."""

    cfg: ArmorConfig
    model: torch.nn.Module
    gen_model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    guard: GuardRunner
    rollout: Any
    lora: bool
    sharded: bool
    gen_copy: bool
    rank: int
    world_size: int
    global_step: int
    points: RollbackPoints
    shard_writer: ShardWriter
    faults: Faults
    _published: dict[str, torch.Tensor] | None

    def _needs_copy(self, cfg: ArmorConfig) -> bool:
        """Whether a sharded worker keeps a full copy of the policy: with LoRA (its merged views and adapters live on
        the copy), the stale-rollout fault (which swaps old weights into the module sampled from), and a backend that
        runs the module it is given but cannot run the shards (``_generates_from_shards``). An engine with weights of
        its own is synced from the shards, and async rollout workers get the policy's state: neither needs one."""
        from armor_core.plugins import get_plugin_manager
        from armor_core.stability.faults import Faults

        if self.lora or Faults(cfg.trainer.faults).any("stale_rollout"):
            return True
        if cfg.rollout.mode != "sync":
            return False
        backend = get_plugin_manager().get("rollout_backend", cfg.rollout.backend, where="rollout.backend")
        return bool(capability("rollout_backend", backend, "shares_module")) and not self._generates_from_shards(cfg)

    def _generates_from_shards(self, cfg: ArmorConfig) -> bool:
        """Whether the rollout engine can run the sharded policy in lockstep (``actor.fsdp_generation``): a colocated
        single-turn backend that runs the module it is given and keeps its ranks in step (``lockstep``; a multi-turn
        rank calls it once per turn, as many turns as its episodes take), without LoRA (whose
        merged views and adapters are kept on the copy) and without the stale-rollout fault (which swaps old weights
        into the module it samples from)."""
        from armor_core.plugins import get_plugin_manager
        from armor_core.stability.faults import Faults

        backend = get_plugin_manager().get("rollout_backend", cfg.rollout.backend, where="rollout.backend")
        return (
            cfg.actor.fsdp_generation == "shards"
            and cfg.rollout.mode == "sync"
            and not cfg.rollout.multi_turn.enable  # each rank's episodes take their own number of turns
            and not self.lora
            and hasattr(backend, "lockstep")
            and capability("rollout_backend", backend, "shares_module")
            and not Faults(cfg.trainer.faults).any("stale_rollout")
        )

    def needs_weight_sync(self) -> bool:
        """False when the rollout engine generates from this very module (colocated), or lives elsewhere (async):
        sync_weights has nothing to send."""
        return self.rollout is not None and getattr(self.rollout, "model", None) is not self.model

    def sync_weights(self) -> dict[str, float]:
        """Hand the new policy to the rollout engine and, with ``rollout.verify_sync``, check that the engine holds it
        (``models/weight_sums.py``): ``{"perf/worker_s": seconds in all, "perf/verify_sync_s": the check's part,
        "perf/sync_gb_per_s": gigabytes sent per second of the sync without the check}``."""
        t0 = time.perf_counter()
        sent, names, nbytes = self._send_weights() if self.needs_weight_sync() else ({}, [], 0)
        t1 = time.perf_counter()
        weight_sums = capability("rollout_backend", self.rollout, "weight_sums")
        if names and self.cfg.rollout.verify_sync and weight_sums is not None:
            check_sync(sent, weight_sums, f"actor rank {self.rank} -> {self.cfg.rollout.backend}", names)
        t2 = time.perf_counter()
        gb = nbytes / 1e9
        return {"perf/worker_s": t2 - t0, "perf/verify_sync_s": t2 - t1, "perf/sync_gb_per_s": gb / max(t1 - t0, 1e-9)}

    def _send_weights(self) -> tuple[Mapping[str, torch.Tensor], list[str], int]:
        """Send the rollout engine what changed; ``(the policy as the engine should now hold it, the names sent,
        the bytes sent)``. The first is what ``check_sync`` reads: whole tensors, or of a bucketed sync only the
        sampled columns its sums take (``sampled``)."""
        from armor_core.models.state_buckets import full_state_buckets
        from armor_core.workers.parallel.strategy import full_model_state

        # under FSDP2 gathering the full weights is a collective: every rank syncs together
        if not self.lora:  # a bucket at a time: under FSDP2 no rank holds the whole model (rollout.sync_bucket_mb)
            kept: dict[str, torch.Tensor] = {}
            nbytes = 0
            lost = self.faults.at("lost_sync", self.global_step) is not None  # fault injection
            for bucket in full_state_buckets(self.model, self.cfg.rollout.sync_bucket_mb << 20):
                items = list(bucket.items())
                if lost:  # the engine never gets the first tensor; the check is told what it should hold
                    items, lost = items[1:], False
                self.rollout.update_weights(items)
                kept.update((name, sampled(t)) for name, t in bucket.items())
                nbytes += sum(t.numel() * t.element_size() for t in bucket.values())
            return kept, list(kept), nbytes
        if self.sharded:
            state = full_model_state(self.model)
            self.gen_model.load_state_dict(state)  # the full copy an hf rollout generates from
            if getattr(self.rollout, "model", None) is self.gen_model:
                return state, list(state), _bytes(state)
        merged = merged_weights(self.gen_model)  # the adapted layers with their adapters merged in
        if capability("rollout_backend", self.rollout, "serves_lora"):
            self.rollout.update_lora(self.gen_model)
        else:  # an engine with its own weights: only the adapted layers, merged
            self.rollout.update_weights(merged.items())
        # the engine's names (the base model's) for all of it: a check may read a whole layer of which one part changed
        return {**MergedView(self.gen_model, merged=False).state_dict(), **merged}, list(merged), _bytes(merged)

    def _publish_policy(self) -> None:
        """Copy the policy for rollout workers of their own (``rollout.mode=async``): the base
        model's plain state dict on CPU (a LoRA policy merged), on rank 0. Done at the end of every
        call that changes the weights, by every rank (under FSDP2 gathering is a collective), so
        ``policy_state`` only hands out a copy that nothing changes any more."""
        from armor_core.workers.parallel.strategy import full_model_state

        if self.lora:
            if self.sharded:
                self.gen_model.load_state_dict(full_model_state(self.model))
            state = MergedView(self.gen_model).state_dict() if self.rank == 0 else {}
        else:
            state = full_model_state(self.model)
        self._published = {k: v.detach().to("cpu", copy=True) for k, v in state.items()} if self.rank == 0 else None

    def policy_state(self) -> dict[str, torch.Tensor] | None:
        """The policy as of the last update (``_publish_policy``); None on ranks other than 0.
        Called through Ray while the worker may already be in its next update: it reads nothing
        that update writes."""
        return self._published

    def save_checkpoint(self, path: str, background: bool = False) -> None:
        """Model, optimizer, scheduler, RNG; resumable on any number of ranks.

        In the full form rank 0 writes the model (a Hugging Face directory) and the optimizer state keyed by
        parameter name, gathered from the shards under FSDP2 (every rank takes part). In the sharded form
        (``actor.checkpoint_format``) every rank writes its own shards to ``actor_shards/`` and rank 0 the
        model's config and tokenizer to ``model_config/``. Each rank writes its RNG state. The states are
        safetensors + JSON (``armor_core/storage/state_io.py``): no pickle. With ``background`` the shards are
        written from a thread (``ShardWriter``); ``wait_saved`` returns once they are.
        """
        from armor_core.workers.parallel.strategy import full_model_state, full_optimizer_state

        p = Path(path)
        p.mkdir(parents=True, exist_ok=True)  # the shards may be written from a thread: the directory is made here
        policy = cast("PreTrainedModel", self.gen_model)  # without LoRA the policy is the causal LM load_model gave
        full: dict[str, torch.Tensor] | None = None  # gathered from the shards, when rank 0 saves the full form
        shards = self._writes_shards()
        if shards:
            optim = self.shard_writer.save(self.model, self.optimizer, str(p / ACTOR_SHARDS), background)
        else:
            self.shard_writer.wait()
            optim = full_optimizer_state(self.model, self.optimizer)
            if self.sharded:  # gathered: rank 0 saves the full model from the copy, or from this state without one
                full = full_model_state(self.model)
                if self.gen_copy:
                    self.gen_model.load_state_dict(full)
        if self.rank == 0:
            if shards:  # what `armor export` needs beside the shards to write a model directory
                out = p / MODEL_CONFIG
                policy.config.save_pretrained(out)
                if policy.generation_config is not None:
                    policy.generation_config.save_pretrained(out)
            elif self.lora:  # the adapter alone, in peft's format
                from armor_core.models.loading import resolve_model_path

                out = p / ADAPTER_DIR
                save_adapter(self.gen_model, out)
                write_base_manifest(out, resolve_model_path(self.cfg.model.path))  # checked on eval and resume
            else:
                out = p / "model"
                if full is not None and not self.gen_copy:  # the policy itself is sharded: write what was gathered
                    policy.save_pretrained(out, safe_serialization=True, state_dict=full)
                else:
                    policy.save_pretrained(out, safe_serialization=True)
            self.tokenizer.save_pretrained(out)
            save_state(
                {
                    "optimizer": optim,
                    "scheduler": self.scheduler.state_dict(),
                    "global_step": self.global_step,
                    "world_size": self.world_size,
                },
                p / "actor_state",
            )
            (p / "guard_worker.json").write_text(json.dumps(self.guard.state_dict()))
        save_state({"torch_rng": torch.get_rng_state()}, p / f"actor_rng_rank{self.rank}")

    def _writes_shards(self) -> bool:
        from armor_core.workers.parallel.strategy import writes_shards

        return writes_shards(self.cfg.actor.checkpoint_format, self.sharded, self.lora)

    def wait_saved(self) -> float:
        """Wait for a checkpoint's shards still being written in the background; the seconds waited."""
        return self.shard_writer.wait()

    def load_checkpoint(self, path: str, rollback: bool = False) -> None:
        """Every rank loads the state, full or sharded, whatever the world size that wrote it; on a ``rollback`` the
        learning rate in force and the guards' state stay (``rollback_point.rates_kept``), as they do when a rollback
        point in memory is restored."""
        from safetensors.torch import load_file

        self.shard_writer.wait()
        from armor_core.workers.parallel.strategy import load_full_model_state, load_full_optimizer_state, load_shards

        p = Path(path)
        check_resume(p / ADAPTER_DIR, self.cfg.model, self.model if self.lora else None, p)
        legacy = self.cfg.trainer.allow_legacy_pt_state  # an older checkpoint's actor_state.pt
        st = load_checkpoint_state(p / "actor_state", allow_legacy_pt=legacy)
        shards = p / ACTOR_SHARDS
        if shards.is_dir():
            if self.lora:
                raise RuntimeError(f"checkpoint {p} holds model shards ({ACTOR_SHARDS}/), not a LoRA adapter")
            with rates_kept(self.optimizer, self.scheduler) if rollback else nullcontext():
                load_shards(self.model, self.optimizer, str(shards), self.world_size, st["optimizer"])
                self.scheduler.load_state_dict(st["scheduler"])
        else:
            if self.lora:
                missing, unexpected = load_full_model_state(self.model, load_adapter_state(p / ADAPTER_DIR))
                missing = [k for k in missing if ".lora_" in k]  # the frozen base comes from model.path
            else:
                state = load_file(str(p / "model" / "model.safetensors"))
                missing, unexpected = load_full_model_state(self.model, state)
                policy = cast("PreTrainedModel", self.model)  # without LoRA, the causal LM that load_model gave
                missing = [k for k in missing if "lm_head" not in k or not policy.config.tie_word_embeddings]
            if unexpected or missing:
                raise RuntimeError(
                    f"checkpoint {p} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
                )
            with rates_kept(self.optimizer, self.scheduler) if rollback else nullcontext():
                load_full_optimizer_state(self.model, self.optimizer, st["optimizer"])
                self.scheduler.load_state_dict(st["scheduler"])
        rng = load_checkpoint_state(p / f"actor_rng_rank{self.rank}", missing_ok=True, allow_legacy_pt=legacy)
        if rng is not None:  # None: resumed on more ranks than saved; the new ranks keep their seeded generator
            torch.set_rng_state(rng["torch_rng"])
        self.global_step = int(st["global_step"])
        guard_file = p / "guard_worker.json"
        if guard_file.exists() and not rollback:
            self.guard.load_state_dict(json.loads(guard_file.read_text()))
        self._weights_changed()

    def _weights_changed(self) -> None:
        """After the weights were loaded or restored: the engines that hold a copy of them get it."""
        self.sync_weights()  # under FSDP2 this also refreshes the full copy the rollout generates from
        if self.cfg.rollout.mode == "async":
            self._publish_policy()

    def rollback_point_bytes(self) -> int:
        return point_bytes(self.optimizer)

    def keep_rollback_point(self, step: int, keep: list[int]) -> dict[str, float]:
        return self.points.keep(step, keep, self.optimizer, self.scheduler, self.global_step)

    def restore_rollback_point(self, step: int) -> None:
        self.global_step = self.points.restore(step, self.optimizer, self.scheduler)
        self._weights_changed()


def _bytes(state: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())
