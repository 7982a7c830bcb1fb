"""The rollout worker of ``rollout.mode=async``: the rollout engine in a process of its own.

It holds the policy's weights as the base model's plain state dict (no optimizer, no reference,
no adapters: a LoRA policy arrives merged) and generates with the configured backend while the
actor workers train. The driver sends it new weights after each update (``set_weights``, the state
dict through Ray's object store) and generation requests; Ray runs one worker's calls in the order
the driver sent them, so a generation sent after a ``set_weights`` uses those weights and one sent
before it the previous ones. Every row it returns carries the version of the weights that
generated it (``policy_version``: the number of updates behind them).
"""

from __future__ import annotations

import time

import torch

from armor_core.config.schema import ArmorConfig, from_dict
from armor_core.dataproto.protocol import DataProto
from armor_core.interfaces import capability
from armor_core.models.weight_sums import check_sync
from armor_core.workers.common import build_on_one_thread, isolate, quiet_transformers, seed_everything
from armor_core.workers.parallel.precision import autocast, compute_dtype
from armor_core.workers.rollout.backend import build_rollout

__all__ = ["RolloutWorker"]

SEED_OFFSET = 104729  # rollout workers draw from other seeds than the actor ranks (seed + rank) and the critic (+ 7919)


class RolloutWorker:
    def __init__(self, config: dict, rank: int = 0, world_size: int = 1, assignment: dict | None = None) -> None:
        from armor_core.models.loading import load_model, load_tokenizer, resolve_model_path
        from armor_core.plugins import get_plugin_manager

        self.cfg: ArmorConfig = from_dict(config)
        cfg = self.cfg
        self.rank = rank
        self.isolation = isolate(assignment, cfg, rank)
        built = build_on_one_thread()
        quiet_transformers()
        seed_everything(cfg.trainer.seed + SEED_OFFSET + rank, cfg.trainer.deterministic)
        self.device = torch.device(cfg.trainer.device)
        self.compute_dtype = compute_dtype(cfg.model.dtype, self.device)
        path = resolve_model_path(cfg.model.path)
        trust = cfg.model.trust_remote_code
        self.tokenizer = load_tokenizer(cfg.model.tokenizer_path or path, trust_remote_code=trust)
        model = load_model(path, "float32", trust_remote_code=trust)
        # transformers annotates PreTrainedModel.to through a decorator pyright reads as taking the model itself
        self.model = model.to(self.device).eval().requires_grad_(False)  # pyright: ignore[reportArgumentType]
        backend_cls = get_plugin_manager().get("rollout_backend", cfg.rollout.backend, where="rollout.backend")
        with autocast(self.device, self.compute_dtype):
            self.backend = build_rollout(backend_cls, self.model, self.tokenizer, cfg.rollout)
        self.version = 0
        self.load_s = 0.0  # seconds the last set_weights took in here
        self.verify_s = 0.0  # of which checking that the engine holds the weights sent (rollout.verify_sync)
        self.verify_sync, self.backend_name = cfg.rollout.verify_sync, cfg.rollout.backend
        built()

    def ping(self) -> dict:
        import os

        return {"rank": self.rank, "pid": os.getpid(), "threads": torch.get_num_threads()}

    def isolation_record(self) -> dict:
        return self.isolation

    @torch.no_grad()
    def set_weights(self, state: dict[str, torch.Tensor], version: int) -> dict[str, float]:
        """Load the policy after ``version`` updates; ``{"perf/weights_load_s": seconds it took}``."""
        t0 = time.perf_counter()
        if getattr(self.backend, "model", None) is self.model:  # the engine generates from this module (hf)
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            missing = [k for k in missing if "lm_head" not in k or not self.model.config.tie_word_embeddings]
            if missing or unexpected:
                raise KeyError(
                    f"rollout worker set_weights: the policy's state does not match {type(self.model).__name__}: "
                    f"missing {missing[:5]}, unexpected {unexpected[:5]}"
                )
        else:
            self.backend.update_weights(state.items())
        t1 = time.perf_counter()
        weight_sums = capability("rollout_backend", self.backend, "weight_sums")
        if self.verify_sync and weight_sums is not None:  # what the engine holds now is the policy sent
            check_sync(state, weight_sums, f"actor rank 0 -> rollout worker {self.rank} ({self.backend_name})")
        self.version = int(version)
        self.load_s = time.perf_counter() - t0
        self.verify_s = time.perf_counter() - t1
        return {"perf/weights_load_s": self.load_s, "perf/verify_sync_s": self.verify_s}

    def rng_state(self) -> dict:
        """torch's generator state (what the ``hf`` backend samples from; a vLLM engine keeps its own)."""
        return {
            "torch_rng": torch.get_rng_state(),
            **({"cuda_rng": torch.cuda.get_rng_state()} if self.device.type == "cuda" else {}),
        }

    def set_rng_state(self, state: dict) -> None:
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"])

    def generate(self, prompts: DataProto, greedy: bool = False) -> DataProto:
        t0 = time.perf_counter()
        with autocast(self.device, self.compute_dtype):
            out = self.backend.generate(prompts.to(self.device), greedy=greedy).to("cpu")
        out["policy_version"] = torch.full((len(out),), self.version, dtype=torch.long)
        out.meta_info["metrics"] = {
            **out.meta_info.get("metrics", {}),
            "perf/worker_s": time.perf_counter() - t0,
            "perf/weights_load_s": self.load_s,
            "perf/verify_sync_s": self.verify_s,
        }
        return out
