"""The actor worker: policy + optimizer, the reference policy, and (colocated) the rollout engine.

One instance lives in each actor process (a Ray actor built by ``engine.WorkerGroup``). It builds
its own plugin manager, so every algorithm it runs is looked up by the name in the config, never
branched on: the policy loss, the loss aggregation, the KL estimator and the guards are all plugins.

Data parallelism: with ``world_size > 1`` the worker joins a torch.distributed group (gloo on CPU,
NCCL on GPU) and wraps the model in DDP; the loss aggregation contract (sum of micro-batch losses
over ranks = full-batch loss, see ``hookspecs.armor_register_loss_aggregations``) is what makes
N workers equal one worker on the same global batch.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Any

import torch

from armor_core.config import ArmorConfig, from_dict
from armor_core.interfaces import call_with_params
from armor_core.protocol import DataProto
from armor_core.workers.common import isolate, quiet_transformers, forward_response_logits, iter_micro_batches, response_log_probs, scalar, seed_everything

__all__ = ["ActorWorker"]


def _lr_lambda(warmup: int, schedule: str, total: int):
    def fn(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if schedule == "constant" or total <= warmup:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress

    return fn


class ActorWorker:
    def __init__(self, config: dict, rank: int = 0, world_size: int = 1, run_dir: str | None = None, assignment: dict | None = None) -> None:
        from armor_core.guard import GuardRunner
        from armor_core.models import load_model, load_tokenizer, resolve_model_path
        from armor_core.plugins import get_plugin_manager

        self.cfg: ArmorConfig = from_dict(config)
        self.rank, self.world_size = rank, world_size
        cfg = self.cfg
        self.isolation = isolate(assignment, cfg, rank)
        quiet_transformers()
        seed_everything(cfg.trainer.seed + rank, cfg.trainer.deterministic)
        self.device = torch.device(cfg.trainer.device)
        if world_size > 1:
            self._init_distributed()

        pm = get_plugin_manager()
        self.policy_loss = pm.get("policy_loss", cfg.actor.policy_loss, where="actor.policy_loss")
        self.loss_agg = pm.get("loss_aggregation", cfg.actor.loss_agg_mode, where="actor.loss_agg_mode")
        self.kl_loss = pm.get("kl_estimator", cfg.actor.kl_loss_type, where="actor.kl_loss_type") if cfg.actor.use_kl_loss else None
        self.guard = GuardRunner(cfg.guard.guards, pm, run_dir, enable=cfg.guard.enable)

        path = resolve_model_path(cfg.model.path)
        self.tokenizer = load_tokenizer(cfg.model.tokenizer_path or path)
        self.model = load_model(path, cfg.model.dtype).to(self.device)
        if cfg.model.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.ref_model = None
        if cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.train_module: torch.nn.Module = self.model
        if world_size > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.train_module = DDP(self.model)
        a = cfg.actor
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=a.lr, betas=tuple(a.betas), weight_decay=a.weight_decay)
        updates_per_step = a.ppo_epochs * (cfg.data.train_batch_size // a.ppo_mini_batch_size)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_lambda(a.warmup_steps, a.lr_schedule, cfg.trainer.total_steps * updates_per_step))
        backend_cls = pm.get("rollout_backend", cfg.rollout.backend, where="rollout.backend")
        self.rollout = backend_cls(self.model, self.tokenizer, cfg.rollout)
        self.global_step = 0
        from collections import deque

        from armor_core.faults import Faults

        self.faults = Faults(cfg.trainer.faults)
        stale = self.faults.any("stale_rollout")
        self._snapshots: deque = deque(maxlen=int(stale.value or 4) if stale else 0)

    def _init_distributed(self) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo", rank=self.rank, world_size=self.world_size)

    def isolation_record(self) -> dict:
        return self.isolation

    def ping(self) -> dict:
        import os

        return {"rank": self.rank, "pid": os.getpid(), "threads": torch.get_num_threads(), "params": sum(p.numel() for p in self.model.parameters())}

    # -- rollout --------------------------------------------------------------------------------

    def generate(self, prompts: DataProto, greedy: bool = False, stale: bool = False) -> DataProto:
        if stale and self._snapshots:  # fault injection: sample from old weights, then put the current ones back
            current = {k: v.clone() for k, v in self.model.state_dict().items()}
            self.model.load_state_dict(self._snapshots[0])
            try:
                return self.rollout.generate(prompts.to(self.device), greedy=greedy).to("cpu")
            finally:
                self.model.load_state_dict(current)
        return self.rollout.generate(prompts.to(self.device), greedy=greedy).to("cpu")

    def sync_weights(self) -> float:
        """Hand the new policy to the rollout engine; returns the seconds it took."""
        t0 = time.perf_counter()
        if getattr(self.rollout, "model", None) is not self.model:  # a colocated engine shares the module
            self.rollout.update_weights(self.model.state_dict().items())
        return time.perf_counter() - t0

    # -- log-probs ------------------------------------------------------------------------------

    @torch.no_grad()
    def _log_probs(self, model: torch.nn.Module, data: DataProto, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        was_training = model.training
        model.eval()
        R = data["responses"].shape[1]
        lps, ents = [], []
        for sl in iter_micro_batches(len(data), self.cfg.actor.micro_batch_size):
            logits = forward_response_logits(model, data["input_ids"][sl].to(self.device), data["attention_mask"][sl].to(self.device), data["position_ids"][sl].to(self.device), R)
            lp, ent = response_log_probs(logits, data["responses"][sl].to(self.device), self.cfg.rollout.temperature, with_entropy)
            lps.append(lp.cpu())
            if ent is not None:
                ents.append(ent.cpu())
        model.train(was_training)
        return torch.cat(lps), (torch.cat(ents) if ents else None)

    def compute_log_prob(self, data: DataProto) -> DataProto:
        lp, ent = self._log_probs(self.model, data, with_entropy=True)
        mask = data["response_mask"]
        return DataProto.from_dict(tensors={"old_log_probs": lp * mask, "entropys": ent * mask})

    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        if self.ref_model is None:
            raise RuntimeError("no reference model: set actor.use_kl_loss or algorithm.use_kl_in_reward")
        lp, _ = self._log_probs(self.ref_model, data, with_entropy=False)
        return DataProto.from_dict(tensors={"ref_log_prob": lp * data["response_mask"]})

    # -- update ---------------------------------------------------------------------------------

    def _global_counts(self, mask: torch.Tensor) -> tuple[float, float]:
        counts = torch.tensor([mask.sum().item(), (mask.sum(-1) > 0).sum().item()], dtype=torch.float64)
        if self.world_size > 1:
            import torch.distributed as dist

            dist.all_reduce(counts)
        return float(counts[0]), float(counts[1])

    def _mismatch(self, train_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
        """Mean and max |log pi_train - log pi_rollout| over valid tokens, reduced over ranks."""
        diff = (train_lp - rollout_lp).abs() * mask
        total, count, mx = diff.sum().item(), mask.sum().item(), diff.max().item() if diff.numel() else 0.0
        if self.world_size > 1:
            import torch.distributed as dist

            t = torch.tensor([total, count], dtype=torch.float64)
            dist.all_reduce(t)
            m = torch.tensor([mx], dtype=torch.float64)
            dist.all_reduce(m, op=dist.ReduceOp.MAX)
            total, count, mx = float(t[0]), float(t[1]), float(m[0])
        return {"rollout/logprob_diff_mean": total / max(count, 1.0), "rollout/logprob_diff_max": mx}

    def _global_sum(self, x: float) -> float:
        if self.world_size == 1:
            return x
        import torch.distributed as dist

        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t[0])

    def _agg(self, mat: torch.Tensor, mask: torch.Tensor, n_tok: float, n_seq: float) -> torch.Tensor:
        a = self.cfg.actor
        norm = a.loss_norm_constant if a.loss_norm_constant is not None else float(self.cfg.rollout.max_new_tokens)
        return self.loss_agg.fn(mat, mask, global_num_tokens=n_tok, global_num_seqs=n_seq, norm_constant=norm)

    def update_actor(self, data: DataProto, step: int) -> dict[str, float]:
        """PPO-style update on this rank's share of the batch; returns metrics (means over mini-batches)."""
        cfg, a = self.cfg, self.cfg.actor
        self.train_module.train()
        n_rows = len(data)
        rows_per_mini = max(1, n_rows * a.ppo_mini_batch_size // cfg.data.train_batch_size)
        on_policy = "old_log_probs" not in data
        sums: dict[str, list[float]] = {}

        def add(k: str, v: Any) -> None:
            sums.setdefault(k, []).append(scalar(v))

        if self._snapshots.maxlen:
            self._snapshots.append({k: v.detach().clone() for k, v in self.model.state_dict().items()})
        first_forward = True
        loss_params = {"clip_ratio_low": a.clip_ratio_low, "clip_ratio_high": a.clip_ratio_high, "clip_ratio_c": a.clip_ratio_c}
        gen = torch.Generator().manual_seed(cfg.trainer.seed * 1000003 + step)
        for _ in range(a.ppo_epochs):
            order = torch.randperm(n_rows, generator=gen) if a.ppo_epochs > 1 or rows_per_mini < n_rows else torch.arange(n_rows)
            for mini_sl in iter_micro_batches(n_rows, rows_per_mini):
                mini = data[order[mini_sl]]
                mask_all = mini["response_mask"].to(self.device).float()
                n_tok, n_seq = self._global_counts(mask_all)
                self.optimizer.zero_grad(set_to_none=True)
                R = mini["responses"].shape[1]
                mini_loss = 0.0
                for sl in iter_micro_batches(len(mini), a.micro_batch_size):
                    mask = mask_all[sl]
                    logits = forward_response_logits(self.train_module, mini["input_ids"][sl].to(self.device), mini["attention_mask"][sl].to(self.device), mini["position_ids"][sl].to(self.device), R)
                    log_prob, entropy = response_log_probs(logits, mini["responses"][sl].to(self.device), cfg.rollout.temperature, with_entropy=True)
                    # exactly on-policy (one update per batch): the old policy *is* this forward, so
                    # the ratio is 1 with the right gradient and the extra forward pass is skipped
                    old = log_prob.detach() if on_policy else mini["old_log_probs"][sl].to(self.device)
                    if first_forward and "rollout_log_probs" in mini:
                        # before the first optimizer step these weights are the ones the rollout
                        # sampled with, so this forward measures the rollout/train mismatch for free
                        mismatch = self._mismatch(log_prob.detach(), mini["rollout_log_probs"][sl].to(self.device), mask)
                        for k, v in mismatch.items():
                            add(k, v)
                    adv = mini["advantages"][sl].to(self.device)
                    loss_mat, pm_metrics = call_with_params(self.policy_loss.fn, log_prob, old, adv, mask, available=loss_params, extra=a.policy_loss_kwargs, where="actor.policy_loss_kwargs")
                    pg_loss = self._agg(loss_mat, mask, n_tok, n_seq)
                    ent_loss = self._agg(entropy, mask, n_tok, n_seq)
                    loss = pg_loss - a.entropy_coeff * ent_loss
                    if self.kl_loss is not None:
                        kl_mat = torch.where(mask.bool(), self.kl_loss.fn(log_prob, mini["ref_log_prob"][sl].to(self.device)), 0.0)  # where, not *: a NaN in padding must not reach the gradient
                        kl = self._agg(kl_mat, mask, n_tok, n_seq)
                        loss = loss + a.kl_loss_coef * kl
                        add("actor/kl_loss", kl)
                    # DDP averages gradients over ranks; the aggregation already divides by global counts
                    (loss * self.world_size).backward()
                    add("actor/pg_loss", pg_loss)
                    mini_loss += scalar(pg_loss)
                    add("actor/entropy", ent_loss)
                    for k, v in pm_metrics.items():
                        add(f"actor/{k}", v)
                if self.faults.at("nan_grad", step):
                    next(p for p in self.model.parameters() if p.grad is not None).grad.view(-1)[0] = float("nan")
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), a.grad_clip if a.grad_clip > 0 else float("inf"))
                gn = scalar(grad_norm)
                add("actor/grad_norm", gn)
                # every rank must reach the same verdict: the norm is already global after DDP's
                # all-reduce, the loss is made global here (contributions sum to the batch loss)
                stats = {"grad_norm": gn, "pg_loss": self._global_sum(mini_loss)}
                if first_forward and "rollout/logprob_diff_mean" in sums:
                    stats.update({k: sums[k][-1] for k in ("rollout/logprob_diff_mean", "rollout/logprob_diff_max")})
                first_forward = False
                verdict = self.guard.observe("grad", stats, step)
                if verdict.action in ("skip", "rollback"):
                    self.optimizer.zero_grad(set_to_none=True)
                    add("actor/skipped_updates", 1.0)
                    continue
                if verdict.action == "scale":
                    for p in self.model.parameters():
                        if p.grad is not None:
                            p.grad.mul_(verdict.scale)
                lr_fault = self.faults.at("lr_scale", step)
                if lr_fault:
                    saved = [g["lr"] for g in self.optimizer.param_groups]
                    for g in self.optimizer.param_groups:
                        g["lr"] *= lr_fault.value
                self.optimizer.step()
                if lr_fault:
                    for g, lr in zip(self.optimizer.param_groups, saved):
                        g["lr"] = lr
                self.scheduler.step()
                add("actor/skipped_updates", 0.0)
        self.global_step = step
        # extremes stay extremes: averaging a max over micro-batches would hide the spike a guard watches
        reduce = {"max": max, "min": min}
        metrics = {k: reduce[k.rsplit("_", 1)[-1]](v) if k.endswith(("_max", "_min")) else sum(v) / len(v) for k, v in sums.items()}
        metrics["actor/lr"] = self.optimizer.param_groups[0]["lr"]
        metrics.update(self.guard.pop_metrics())
        return metrics

    ADJUSTABLE = ("lr", "clip_ratio_low", "clip_ratio_high", "kl_loss_coef", "entropy_coeff")

    def apply_adjustments(self, adjustments: dict[str, float]) -> None:
        """Coefficients a guard changed (absolute values). ``lr`` is the base rate the schedule scales."""
        for key, value in adjustments.items():
            if key not in self.ADJUSTABLE:
                raise ValueError(f"a guard asked to adjust {key!r}; adjustable: {', '.join(self.ADJUSTABLE)}")
            if key == "lr":
                self.scheduler.base_lrs = [float(value)] * len(self.optimizer.param_groups)
                factor = self.scheduler.lr_lambdas[0](self.scheduler.last_epoch)
                for group in self.optimizer.param_groups:
                    group["lr"] = float(value) * factor
            else:
                setattr(self.cfg.actor, key, float(value))

    # -- checkpoints ----------------------------------------------------------------------------

    def save_checkpoint(self, path: str) -> None:
        """Model (as a HF directory), optimizer, scheduler, RNG. Rank 0 writes the model."""
        p = Path(path)
        if self.rank == 0:
            self.model.save_pretrained(p / "model", safe_serialization=True)
            self.tokenizer.save_pretrained(p / "model")
        torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                    "torch_rng": torch.get_rng_state(), "global_step": self.global_step}, p / f"actor_state_rank{self.rank}.pt")
        if self.rank == 0:
            (p / "guard_worker.json").write_text(__import__("json").dumps(self.guard.state_dict()))

    def load_checkpoint(self, path: str) -> None:
        from safetensors.torch import load_file

        p = Path(path)
        state = load_file(str(p / "model" / "model.safetensors"))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or [m for m in missing if "lm_head" not in m or not self.model.config.tie_word_embeddings]:
            if unexpected or missing:
                raise RuntimeError(f"checkpoint {p} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        rank_file = p / f"actor_state_rank{self.rank}.pt"
        if not rank_file.exists():  # resumed on more ranks than saved: optimizer state of rank 0
            rank_file = p / "actor_state_rank0.pt"
        st = torch.load(rank_file, weights_only=True)
        self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        torch.set_rng_state(st["torch_rng"])
        self.global_step = int(st["global_step"])
        guard_file = p / "guard_worker.json"
        if guard_file.exists():
            self.guard.load_state_dict(__import__("json").loads(guard_file.read_text()))
        self.sync_weights()
