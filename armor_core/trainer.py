"""The RL loop on the driver. One step:

1. take a batch of prompts, repeat each ``rollout.n`` times (interleaved, so a group is contiguous);
2. generate responses in the actor workers (the rollout engine lives there);
3. score each row with the reward domain its ``data_source`` routes to; the score sits on the last
   response token;
4. old log-probs (skipped when the update is exactly on-policy), reference log-probs (when KL is
   used), values (when the estimator ``requires_critic``); KL folded into the reward if configured;
5. advantages from the configured estimator;
6. critic update, actor update;
7. the StabilityGuard looks at each stage and may skip the update or roll back;
8. new weights to the rollout engine; metrics; checkpoint and validation on schedule.

The driver holds no model (only a tokenizer, to decode responses for the reward). It never asks
which algorithm it runs: the estimator, losses, KL estimators, guards and rollout backend are
plugins looked up by their config names, and their metadata (``requires_critic``) decides what
gets built.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from armor_core.config import ArmorConfig, to_dict
from armor_core.data import Dataset, PromptLoader, encode_dataset, load_rows, task_rows
from armor_core.engine import WorkerDiedError
from armor_core.interfaces import call_with_params

__all__ = ["Trainer", "prepare_data", "run_training"]


def prepare_data(cfg: ArmorConfig, pm: Any = None, tokenizer: Any = None, rewards: Any = None) -> tuple[Dataset, Dataset | None]:
    """Load and check the train and validation rows; every problem is reported before workers start."""
    from armor_core.models import load_tokenizer, resolve_model_path
    from armor_core.plugins import get_plugin_manager
    from armor_core.rewards import RewardManager

    pm = pm or get_plugin_manager()
    tokenizer = tokenizer or load_tokenizer(cfg.model.tokenizer_path or resolve_model_path(cfg.model.path))
    own_rewards = rewards is None
    rewards = rewards or RewardManager(cfg.reward, pm)
    d = cfg.data
    try:
        needs_gt = lambda source: any(pm.get("reward_domain", name).requires_ground_truth for name in rewards.domains_for(source))  # noqa: E731
        if d.train_files:
            train = load_rows(d.train_files, skip_invalid=d.skip_invalid, prompt_key=d.prompt_key, needs_ground_truth=needs_gt)
        else:
            train = task_rows(pm, d.task, "train", d.train_size, cfg.trainer.seed, d.task_kwargs)
        if d.val_files:
            val = load_rows(d.val_files, skip_invalid=d.skip_invalid, prompt_key=d.prompt_key, needs_ground_truth=needs_gt)
        elif not d.train_files and d.task:
            val = task_rows(pm, d.task, "test", d.val_size, cfg.trainer.seed, d.task_kwargs)
        else:
            val = None
        for ds in (train, val):
            if ds is not None:
                rewards.check_rows(ds.rows, ds.source)
                ds.encoded = encode_dataset(ds, tokenizer, d.max_prompt_length, d.truncation)  # type: ignore[attr-defined]
    finally:
        if own_rewards:
            rewards.close()
    return train, val


class _Stage:
    worker_s: float | None = None  # seconds the workers report spending inside the call


class _Timer:
    """Seconds per stage of a step. A stage that calls workers sets ``worker_s`` (from
    ``perf/worker_s`` in what they return); its wall time beyond that (Ray calls, serialisation,
    dispatch, waiting for the slowest rank) goes to ``timing_s/overhead``, so stages still add up
    to ``timing_s/step``."""

    def __init__(self) -> None:
        self.t: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.t[f"timing_s/{name}"] = self.t.get(f"timing_s/{name}", 0.0) + seconds

    @contextmanager
    def __call__(self, name: str):
        t0 = time.perf_counter()
        stage = _Stage()
        yield stage
        wall = time.perf_counter() - t0
        inside = wall if stage.worker_s is None else min(wall, stage.worker_s)
        self.add(name, inside)
        if stage.worker_s is not None:
            self.add("overhead", wall - inside)


def _worker_seconds(reported: Any) -> float | None:
    """The slowest rank's ``perf/worker_s``: a float (one worker), a list (per rank), or None."""
    if isinstance(reported, (list, tuple)):
        return max(reported) if reported else None
    return None if reported is None else float(reported)


#: stages that are the engine's own cost, not generation, reward, algorithm or training compute
ENGINE_STAGES = ("data", "update_weights", "overhead", "log", "other")


def _masked_stats(prefix: str, x: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    m = mask.bool()
    if not m.any():
        return {f"{prefix}/mean": 0.0, f"{prefix}/max": 0.0, f"{prefix}/min": 0.0}
    v = x[m].float()
    return {f"{prefix}/mean": v.mean().item(), f"{prefix}/max": v.max().item(), f"{prefix}/min": v.min().item()}


@dataclass
class _Queued:
    """The next step's prompts (repeated ``rollout.n`` times) and their rollout, already generated (or None: generate it)."""

    gen_in: Any
    out: Any


class Trainer:
    def __init__(self, cfg: ArmorConfig, resume: bool = False) -> None:
        from armor_core.checkpoint import CheckpointManager
        from armor_core.config import validate_plugins
        from armor_core.guard import GuardRunner
        from armor_core.models import load_tokenizer, resolve_model_path
        from armor_core.plugins import get_plugin_manager
        from armor_core.rewards import RewardManager

        self.cfg = cfg
        self.t_start = time.perf_counter()
        self.run_dir = Path(cfg.trainer.run_dir)
        self.pm = get_plugin_manager()
        validate_plugins(cfg, self.pm)
        self.estimator = self.pm.get("advantage_estimator", cfg.algorithm.adv_estimator, where="algorithm.adv_estimator")
        self.tokenizer = load_tokenizer(cfg.model.tokenizer_path or resolve_model_path(cfg.model.path))
        self.rewards = RewardManager(cfg.reward, self.pm)
        self.train_ds, self.val_ds = prepare_data(cfg, self.pm, self.tokenizer, self.rewards)
        for ds in (self.train_ds, self.val_ds):
            if ds is not None and (ds.dropped_too_long or ds.skipped):
                print(f"{ds.source}: {len(ds.encoded['non_tensors']['uid'])} rows used; {ds.dropped_too_long} dropped as longer than "
                      f"data.max_prompt_length={cfg.data.max_prompt_length}, {ds.skipped} skipped as invalid")
        self.loader = PromptLoader(self.train_ds.encoded, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.trainer.seed)
        self.ckpt = CheckpointManager(self.run_dir, cfg.trainer.keep_checkpoints)
        if not resume and self.ckpt.latest() is not None:
            raise RuntimeError(f"{self.run_dir} already holds checkpoints; pass --resume to continue, or choose another trainer.run_dir")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
        self.guard = GuardRunner(cfg.guard.guards, self.pm, self.run_dir, enable=cfg.guard.enable)
        from armor_core.faults import Faults

        self.faults = Faults(cfg.trainer.faults)
        self.kl_ctrl = None
        if cfg.algorithm.use_kl_in_reward:
            from armor_plugins.losses.kl import build_kl_controller

            a = cfg.algorithm
            self.kl_ctrl = build_kl_controller(a.kl_ctrl_type, a.kl_coef, a.kl_target, a.kl_horizon)
        self.trackers = [self.pm.get("metric_tracker", name)(self.run_dir, cfg) for name in cfg.trainer.loggers]
        self._log_s = 0.0  # seconds the trackers spent since the last step began
        self.step = 0
        self.history: list[dict[str, float]] = []
        self.val_history: list[dict[str, float]] = []
        # the driver's tensors are small; its extra torch threads would only spin on the workers'
        # cores. Set back by close(), or here if starting fails.
        self._threads_before = torch.get_num_threads()
        torch.set_num_threads(cfg.engine.driver_threads)
        try:
            self._start_workers()
            if resume:
                self._resume()
        except BaseException:  # e.g. a checkpoint that does not fit this config: free the workers' cores before saying why
            for group in self._groups():
                group.shutdown()
            for tracker in self.trackers:
                tracker.close()
            torch.set_num_threads(self._threads_before)
            raise

    # -- setup ----------------------------------------------------------------------------------

    def _start_workers(self) -> None:
        from armor_core.engine import WorkerGroup, init_ray
        from armor_core.workers.actor import ActorWorker
        from armor_core.workers.critic import CriticWorker

        from armor_core.isolation import ProcessIsolator, detect_available_cpus

        e, a = self.cfg.engine, self.cfg.actor
        asynchronous = self.cfg.rollout.mode == "async"
        groups = {"actor": a.num_workers, **({"critic": self.cfg.critic.num_workers or a.num_workers} if self.estimator.requires_critic else {}),
                  **({"rollout": self.cfg.rollout.num_workers} if asynchronous else {})}
        n_workers = sum(groups.values())
        cpus = e.cpus_per_worker or max(1, len(detect_available_cpus()) // n_workers)
        self.cfg.engine.cpus_per_worker = cpus  # workers read their thread count from it
        # isolate before any worker starts: a plan with two workers on one core is an error now, not a slow run later
        isolator, plan = None, {}
        if e.isolate and not e.address:
            isolator = ProcessIsolator(cpus, e.gpus_per_worker, self.cfg.trainer.seed)
            for asg in isolator.plan(groups):
                plan.setdefault(asg.group, []).append({"assignment": {"group": asg.group, "rank": asg.rank, "cpus": list(asg.cpus), "gpus": list(asg.gpus), "node": asg.node}})
        t0 = time.perf_counter()
        init_ray(e.address, e.num_cpus, n_workers * cpus)
        self.startup_s = {"ray_init": time.perf_counter() - t0}
        conf = to_dict(self.cfg)
        t0 = time.perf_counter()
        self.actor = WorkerGroup(ActorWorker, a.num_workers, cpus_per_worker=cpus, gpus_per_worker=e.gpus_per_worker,
                                 name="actor", init_kwargs={"config": conf, "run_dir": str(self.run_dir)}, rank_kwargs=plan.get("actor"),
                                 channel=e.direct_channel)
        self.critic = None
        if "critic" in groups:
            self.critic = WorkerGroup(CriticWorker, groups["critic"], cpus_per_worker=cpus, gpus_per_worker=e.gpus_per_worker,
                                      name="critic", init_kwargs={"config": conf}, rank_kwargs=plan.get("critic"), channel=e.direct_channel)
        self.async_rollout = None
        if asynchronous:
            from armor_core.async_rollout import AsyncRollout
            from armor_core.workers.rollout import RolloutWorker

            # channel=False: Ray runs a rollout worker's calls in the order sent, weight pushes between generations
            group = WorkerGroup(RolloutWorker, groups["rollout"], cpus_per_worker=cpus, gpus_per_worker=e.gpus_per_worker,
                                name="rollout", init_kwargs={"config": conf}, rank_kwargs=plan.get("rollout"), channel=False)
            self.async_rollout = AsyncRollout(group, self.actor, self.loader, self.cfg.rollout.n, self.cfg.rollout.max_staleness)
        self.startup_s["workers"] = time.perf_counter() - t0
        self._queued: _Queued | None = None  # the next step's generation, when already sent (overlap_generation)
        self.needs_weight_sync = any(self.actor.call("needs_weight_sync"))  # a colocated engine shares the actor's module
        # isolation.json: what each worker applied, and where Ray placed it (node id and IP, pid)
        records = [{**place, **rec} for g in self._groups() for place, rec in zip(g.placement, g.call("isolation_record"))]
        if isolator is not None:
            isolator.report(records, self.run_dir)  # printed, and saved as isolation.json
        else:
            from armor_core.isolation import write_assignment

            # on a joined cluster the driver cannot know which cores another node's raylet (or the other
            # raylets on one machine) hands out, so nothing is pinned; workers still run cpus_per_worker threads
            reason = "joined Ray cluster (engine.address): cores are not pinned" if e.address else "engine.isolate=false"
            write_assignment(self.run_dir, [{**r, "isolated": False, "reason": reason} for r in records])

    def _groups(self) -> list[Any]:
        return [g for g in (getattr(self, "actor", None), getattr(self, "critic", None), getattr(getattr(self, "async_rollout", None), "group", None)) if g is not None]

    def _resume(self) -> None:
        path = self.ckpt.latest()
        if path is None:
            print(f"--resume: no checkpoint in {self.ckpt.root}; starting from step 0")
            return
        self._load(path)
        print(f"resumed from {path} at step {self.step}")

    def _load(self, path: Path, restore_guards: bool = True) -> None:
        state = self.ckpt.trainer_state(path)
        self.actor.call("load_checkpoint", str(path))
        if self.critic is not None:
            self.critic.call("load_checkpoint", str(path))
        self.step = int(state["step"])
        self.loader.load_state_dict(state["loader"])
        if self.async_rollout is not None:  # generated by weights and from prompts that were just taken back
            self.async_rollout.drop()
        if restore_guards:  # on a rollback the guards keep what they learned, e.g. how often they rolled back
            self.guard.load_state_dict(state.get("guard", {}))
        if self.kl_ctrl is not None and "kl_ctrl" in state:
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self.val_history = state.get("val_history", [])

    def save_checkpoint(self) -> Path:
        loader = self.async_rollout.loader_state() if self.async_rollout is not None else self.loader.state_dict()
        state = {"step": self.step, "loader": loader, "guard": self.guard.state_dict(),
                 "val_history": self.val_history, **({"kl_ctrl": self.kl_ctrl.state_dict()} if self.kl_ctrl else {})}

        def write(tmp: Path) -> None:
            self.actor.call("save_checkpoint", str(tmp))
            if self.critic is not None:
                self.critic.call("save_checkpoint", str(tmp))

        return self.ckpt.save(self.step, write, state)

    # -- one step -------------------------------------------------------------------------------

    def _decode(self, batch) -> list[str]:
        # plain lists and one batch_decode: per-row tensor indexing cost more than the decoding
        rows = [[t for t, keep in zip(r, m) if keep] for r, m in zip(batch["responses"].tolist(), batch["response_mask"].tolist())]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def _score(self, batch) -> tuple[torch.Tensor, dict[str, float]]:
        nt = batch.non_tensors
        lengths = batch["response_mask"].sum(-1).tolist()
        # the response's token count lets a domain apply a length penalty in tokens (DAPO's overlong shaping)
        extras = [{**(e or {}), "response_length": int(n)} for e, n in zip(nt["extra"], lengths)]
        out = self.rewards.score(list(nt["raw_prompt"]), self._decode(batch), list(nt["data_source"]), list(nt["ground_truth"]), extras)
        return torch.as_tensor(out.scores, dtype=torch.float32), dict(out.metrics)

    def _generated(self, timer: "_Timer", metrics: dict[str, float]) -> Any:
        """A batch of prompts, each repeated ``rollout.n`` times, with their responses: generated
        during the last step's update call (``trainer.overlap_generation``), by the rollout workers
        while the actor trained (``rollout.mode=async``, see ``async_rollout.py``), or now."""
        cfg = self.cfg
        if self.async_rollout is not None:
            timer.add("update_weights", self.async_rollout.push(self.step))
            with timer("gen"):  # the wait for a batch the rollout workers generated while the actor trained
                gen_in, out, _ = self.async_rollout.next(self.step)
            rollout_metrics = out.meta_info.pop("metrics", {})
            metrics.update({k: v for k, v in rollout_metrics.items() if k.startswith("rollout/")})
            metrics["perf/rollout_worker_s"] = _worker_seconds(rollout_metrics.get("perf/worker_s")) or 0.0
            metrics["perf/rollout_weights_load_s"] = _worker_seconds(rollout_metrics.get("perf/weights_load_s")) or 0.0
            return gen_in.select(non_tensor_keys=list(gen_in.non_tensors)).union(out.select(tensor_keys=list(out.tensors)))
        queued, self._queued = self._queued, None
        with timer("data"):
            gen_in = queued.gen_in if queued is not None else self.loader.next_batch().repeat(cfg.rollout.n, interleave=True)
        if queued is not None and queued.out is not None:  # generated at the end of the last step's call, and timed there
            out = queued.out
            timer.add("gen", 0.0)
        else:
            with timer("gen") as stage:
                stale = self.faults.at("stale_rollout", self.step + 1) is not None
                out = self.actor.dispatch("generate", gen_in.select(tensor_keys=["input_ids", "attention_mask", "position_ids"]), stale=stale)
                stage.worker_s = _worker_seconds(out.meta_info.pop("metrics", {}).get("perf/worker_s"))
        return gen_in.select(non_tensor_keys=list(gen_in.non_tensors)).union(out.select(tensor_keys=list(out.tensors)))

    def _scored(self, batch: Any, timer: "_Timer") -> tuple[torch.Tensor, dict[str, float]]:
        with timer("reward"):
            scores, reward_metrics = self._score(batch)
            return self._inject_reward_faults(scores), reward_metrics

    def _collect(self, timer: "_Timer", metrics: dict[str, float]) -> tuple[Any, torch.Tensor]:
        """This step's scored rows. With ``algorithm.filter_groups`` (DAPO's dynamic sampling) the
        groups whose scores all agree are dropped and more batches are generated until
        ``data.train_batch_size`` groups are kept or ``algorithm.max_gen_batches`` were generated;
        the batch's ``uid`` then numbers the kept groups."""
        from armor_core.protocol import DataProto

        cfg, n = self.cfg, self.cfg.rollout.n
        batch = self._generated(timer, metrics)
        scores, reward_metrics = self._scored(batch, timer)
        if not cfg.algorithm.filter_groups:
            metrics.update(reward_metrics)
            return batch, scores
        want, kept, kept_scores, all_metrics = cfg.data.train_batch_size, [], [], [reward_metrics]
        generated = 0
        for gen in range(cfg.algorithm.max_gen_batches):
            if gen:
                batch = self._generated(timer, metrics)
                scores, reward_metrics = self._scored(batch, timer)
                all_metrics.append(reward_metrics)
            groups = scores.view(-1, n)
            informative = (groups != groups[:, :1]).any(-1).repeat_interleave(n)
            generated += len(groups)
            kept.append(batch[informative.numpy()])
            kept_scores.append(scores[informative])
            if sum(len(k) for k in kept) >= want * n:
                break
        batch, scores = DataProto.concat(kept), torch.cat(kept_scores)
        n_groups = min(want, len(batch) // n)
        n_groups -= n_groups % max(1, self.cfg.actor.num_workers // math.gcd(n, self.cfg.actor.num_workers))  # rows split evenly over the actor's ranks
        batch, scores = batch[np.arange(n_groups * n)], scores[: n_groups * n]
        batch["uid"] = np.repeat(np.arange(n_groups, dtype=np.int64), n)
        for key in set().union(*all_metrics):  # each batch's reward metrics, averaged
            values = [m[key] for m in all_metrics if key in m]
            metrics[key] = sum(values) / len(values)
        metrics.update({"dynamic_sampling/gen_batches": gen + 1, "dynamic_sampling/groups_generated": generated,
                        "dynamic_sampling/groups_kept": n_groups, "dynamic_sampling/groups_dropped": generated - sum(len(k) for k in kept) // n,
                        "dynamic_sampling/short_batch": float(n_groups < want)})
        if n_groups < want:
            warnings.warn(f"step {self.step + 1}: algorithm.filter_groups kept {n_groups} of data.train_batch_size={want} groups after "
                          f"algorithm.max_gen_batches={cfg.algorithm.max_gen_batches} batches ({generated} groups generated, the rest all scored alike); "
                          "training on those", stacklevel=2)
        return batch, scores

    def train_step(self) -> dict[str, float]:
        cfg = self.cfg
        timer = _Timer()
        metrics: dict[str, float] = {}
        # the trackers' time on the metrics logged since the last step (a step's metrics are
        # logged after it ends): engine time every step costs, so it is part of the step
        timer.add("log", self._log_s)
        t_step = time.perf_counter() - self._log_s
        self._log_s = 0.0
        batch, scores = self._collect(timer, metrics)
        if not len(batch):  # algorithm.filter_groups kept no group: nothing to learn from this step
            self.step += 1
            metrics.update({"guard/skipped_step": 1.0, **timer.t, "timing_s/step": time.perf_counter() - t_step})
            return metrics
        mask = batch["response_mask"].float()
        resp_len = mask.sum(-1)
        last = (resp_len - 1).clamp(min=0).long()
        token_scores = torch.zeros_like(mask)
        has = resp_len > 0
        token_scores[has, last[has]] = scores[has]
        batch["token_level_scores"] = token_scores
        verdicts = [self.guard.observe("reward", {"score/mean": scores.mean().item(), "score/min": scores.min().item(), "score/max": scores.max().item()}, self.step + 1)]

        on_policy = cfg.actor.ppo_epochs == 1 and cfg.actor.ppo_mini_batch_size == cfg.data.train_batch_size
        if not on_policy:
            with timer("old_log_prob") as stage:
                old = self.actor.dispatch("compute_log_prob", batch)
                stage.worker_s = _worker_seconds(old.meta_info.pop("metrics", {}).get("perf/worker_s"))
            batch = batch.union(old.select(tensor_keys=["old_log_probs"]))
            if "rollout_log_probs" in batch:
                diff = (batch["old_log_probs"] - batch["rollout_log_probs"]).abs() * mask
                metrics["rollout/logprob_diff_mean"] = (diff.sum() / mask.sum().clamp(min=1)).item()
                metrics["rollout/logprob_diff_max"] = diff.max().item()
        if cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:
            with timer("ref") as stage:
                ref = self.actor.dispatch("compute_ref_log_prob", batch)
                stage.worker_s = _worker_seconds(ref.meta_info.pop("metrics", {}).get("perf/worker_s"))
                batch = batch.union(ref)
        if self.critic is not None:
            with timer("values"):
                batch = batch.union(self.critic.dispatch("compute_values", batch))

        with timer("adv"):
            if self.kl_ctrl is not None:
                from armor_plugins.losses.kl import apply_kl_penalty

                behaviour = batch["old_log_probs"] if "old_log_probs" in batch else batch["rollout_log_probs"]
                kl_est = self.pm.get("kl_estimator", cfg.algorithm.kl_penalty, where="algorithm.kl_penalty")
                rewards, kl_m = apply_kl_penalty(batch["token_level_scores"], behaviour, batch["ref_log_prob"], mask, self.kl_ctrl.value, kl_est)
                self.kl_ctrl.update(kl_m["reward_kl"], cfg.data.train_batch_size)
                metrics.update({f"actor/{k}": v for k, v in kl_m.items()})
            else:
                rewards = batch["token_level_scores"]
            batch["token_level_rewards"] = rewards
            a = cfg.algorithm
            available = {"values": batch["values"] if "values" in batch else None, "gamma": a.gamma, "lam": a.lam, "norm_adv_by_std": a.norm_adv_by_std}
            index = torch.as_tensor(np.asarray(batch.non_tensors["uid"], dtype=np.int64))
            adv, ret = call_with_params(self.estimator.fn, rewards, mask, index, available=available, extra=a.adv_kwargs, where="algorithm.adv_kwargs")
            batch["advantages"], batch["returns"] = adv.float(), ret.float()
        adv_stats = _masked_stats("critic/advantages", adv, mask)
        pre_update = {**adv_stats, **{k: v for k, v in metrics.items() if k.startswith("rollout/")}}
        verdicts.append(self.guard.observe("advantage", pre_update, self.step + 1))
        metrics.update(adv_stats)
        metrics.update(_masked_stats("critic/returns", ret, mask))

        skip = any(v.action in ("skip", "rollback") for v in verdicts)
        if skip:
            metrics["guard/skipped_step"] = 1.0
        else:
            if self.critic is not None:
                with timer("update_critic"):
                    metrics.update(self.critic.dispatch("update_critic", batch, self.step + 1))
            update_in = batch.select(tensor_keys=[k for k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "advantages", "old_log_probs", "ref_log_prob", "rollout_log_probs") if k in batch])
            next_in = self._next_generation_input()
            if next_in is not None:
                metrics.update(self._update_then_generate(update_in, next_in, timer))
            else:
                with timer("update_actor") as stage:
                    actor_metrics = self.actor.dispatch("update_actor", update_in, self.step + 1)
                    stage.worker_s = _worker_seconds(actor_metrics.pop("perf/worker_s", None))
                    metrics.update(actor_metrics)
                if self.needs_weight_sync:
                    with timer("update_weights") as stage:
                        stage.worker_s = _worker_seconds(self.actor.call("sync_weights"))
                else:
                    timer.add("update_weights", 0.0)
        self.step += 1
        after = self.guard.observe("update", {k: v for k, v in metrics.items() if k.startswith(("actor/", "rollout/"))}, self.step)
        self._act_on([*verdicts, after], metrics)

        n_tokens = float(batch["attention_mask"].sum())
        metrics.update({
            "critic/score/mean": scores.mean().item(), "critic/score/max": scores.max().item(), "critic/score/min": scores.min().item(),
            "critic/rewards/mean": (rewards.sum(-1)).mean().item(),
            "response_length/mean": resp_len.mean().item(), "response_length/max": resp_len.max().item(), "response_length/min": resp_len.min().item(),
            "response_length/clip_ratio": (resp_len >= batch["responses"].shape[1]).float().mean().item(),
            "prompt_length/mean": float(batch["attention_mask"].sum(-1).float().mean() - resp_len.mean()),
            "training/epoch": float(self.loader.epoch),
        })
        metrics.update(timer.t)
        metrics.update(self.guard.pop_metrics())
        step_s = time.perf_counter() - t_step
        metrics["timing_s/step"] = step_s
        metrics["timing_s/other"] = step_s - sum(v for k, v in timer.t.items())
        metrics["perf/engine_overhead_frac"] = sum(metrics.get(f"timing_s/{k}", 0.0) for k in ENGINE_STAGES) / step_s
        metrics["perf/total_num_tokens"] = n_tokens
        metrics["perf/throughput"] = n_tokens / step_s
        return metrics

    def _next_generation_input(self) -> Any:
        """With ``trainer.overlap_generation``: the next step's prompts (repeated ``rollout.n``
        times), to be generated in the same worker call as this step's update; else None.

        The workers then run the same work in the same order as with two calls (update, sync,
        generate), so samples, RNG and weights are unchanged; what goes is a round trip and the
        workers' idle time while the driver handles the update's result. Not before a step after
        which the driver calls the workers for something else (validation; a checkpoint, whose RNG
        state must be the one before this generation), after the last step, or when the next batch
        would start an epoch that ``trainer.total_epochs`` forbids.
        """
        t, step = self.cfg.trainer, self.step + 1  # the step being updated now
        if (not t.overlap_generation or self.async_rollout is not None or step >= t.total_steps or (t.val_freq and step % t.val_freq == 0) or (t.save_freq and step % t.save_freq == 0)
                or (t.total_epochs is not None and self.loader.next_starts_epoch)):
            return None
        return self.loader.next_batch().repeat(self.cfg.rollout.n, interleave=True)

    def _update_then_generate(self, update_in: Any, next_in: Any, timer: "_Timer") -> dict[str, float]:
        """One worker call: this step's update and the next step's generation (``_next_generation_input``).
        The generation's seconds count in this step's ``timing_s/gen``: each step's timings hold the
        work done during it, so they still add up to ``timing_s/step``."""
        stale = self.faults.at("stale_rollout", self.step + 2) is not None
        t0 = time.perf_counter()
        metrics, out = self.actor.submit_pair("update_then_generate", update_in, next_in.select(tensor_keys=["input_ids", "attention_mask", "position_ids"]),
                                              self.step + 1, stale=stale).result()
        wall = time.perf_counter() - t0
        update_s = _worker_seconds(metrics.pop("perf/worker_s", None)) or 0.0
        sync_s = metrics.pop("perf/sync_s", 0.0)
        gen_s = _worker_seconds(out.meta_info.pop("metrics", {}).get("perf/worker_s")) or 0.0
        timer.add("update_actor", update_s)
        timer.add("update_weights", sync_s)
        timer.add("gen", gen_s)
        timer.add("overhead", max(0.0, wall - update_s - sync_s - gen_s))
        self._queued = _Queued(next_in, out)
        metrics["perf/next_generated"] = 1.0  # this step's call also generated the next step's rollout
        return metrics

    def _act_on(self, verdicts: list, metrics: dict[str, float]) -> None:
        """Roll back if any guard asked, then apply every adjustment (after: a rollback restores the old optimizer)."""
        rollbacks = [v for v in verdicts if v.action == "rollback"]
        if rollbacks:
            sinces = [v.since for v in rollbacks if v.since is not None]
            self._rollback(metrics, min(sinces) if sinces else None)
        from armor_core.guard import merge_adjustments

        adjustments = merge_adjustments([v for v in verdicts if v.adjustments])
        if adjustments:  # applied from the next update on, identically on every rank
            self.actor.call("apply_adjustments", adjustments)
            metrics.update({f"guard/adjust/{k}": float(v) for k, v in adjustments.items()})

    def _inject_reward_faults(self, scores: torch.Tensor) -> torch.Tensor:
        step = self.step + 1
        if self.faults.at("flip_reward", step):
            scores = 1.0 - scores
        if self.faults.at("random_reward", step):
            scores = torch.rand(scores.shape, generator=torch.Generator().manual_seed(step))
        if self.faults.at("inf_reward", step):
            scores = scores.clone()
            scores[0] = float("inf")
        return scores

    def _rollback(self, metrics: dict[str, float], since: int | None = None) -> None:
        """Restore the newest checkpoint older than ``since`` (the first suspected update), or the newest."""
        path = self.ckpt.latest() if since is None else self.ckpt.before(since)
        metrics["guard/rollback"] = 1.0
        if path is None and since is not None and self.ckpt.latest() is not None:
            oldest = self.ckpt.completed()[0]
            print(f"step {self.step}: no checkpoint older than step {since} is kept (trainer.keep_checkpoints={self.cfg.trainer.keep_checkpoints}); "
                  f"rolling back to the oldest one, {oldest.name}, which may already be affected")
            path = oldest
        if path is None:
            print(f"step {self.step}: the guard asked for a rollback but no checkpoint exists yet; the update was skipped")
            return
        position, step = self.loader.state_dict(), self.step
        if self._queued is not None:  # generated by the weights just discarded: its prompts are sampled again
            self._queued = _Queued(self._queued.gen_in, None)
        self._load(path, restore_guards=False)
        # roll back the weights, not the data or the clock: the offending batches are skipped and
        # step numbers stay monotonic in the logs (a rollback is an event at this step)
        self.loader.load_state_dict(position)
        self.step = step
        print(f"step {self.step}: rolled back to {path.name}")

    # -- validation -----------------------------------------------------------------------------

    def validate(self) -> dict[str, float]:
        if self.val_ds is None:
            return {}
        from armor_core.protocol import DataProto
        from armor_core.rewards import accuracy_by_source

        enc = self.val_ds.encoded
        data = DataProto.from_dict(tensors=dict(enc["tensors"]), non_tensors=dict(enc["non_tensors"]))
        out: dict[str, float] = {}
        modes = [("greedy", True)] + ([("sampled", False)] if self.cfg.trainer.val_sampled else [])
        for mode, greedy in modes:
            pad = (-len(data)) % (self.async_rollout.group.n if self.async_rollout is not None else self.actor.n)
            padded = DataProto.concat([data, data[:pad]]) if pad else data
            prompts = padded.select(tensor_keys=["input_ids", "attention_mask", "position_ids"])
            if self.async_rollout is not None:
                gen = self.async_rollout.generate(prompts, self.step, greedy=greedy)
            else:
                gen = self.actor.dispatch("generate", prompts, greedy=greedy)
            gen = gen[: len(data)]
            full = data.select(non_tensor_keys=list(data.non_tensors)).union(gen.select(tensor_keys=list(gen.tensors)))
            scores, _ = self._score(full)
            out.update(accuracy_by_source(scores.numpy(), full.non_tensors["data_source"], mode, prefix="val/"))
        out["val/step"] = float(self.step)
        self.val_history.append(out)
        return out

    # -- the loop -------------------------------------------------------------------------------

    def log(self, metrics: dict[str, float]) -> None:
        t0 = time.perf_counter()
        for t in self.trackers:
            t.log(metrics, self.step)
        self._log_s += time.perf_counter() - t0  # charged to the next step (see train_step)

    def fit(self) -> dict[str, Any]:
        t = self.cfg.trainer
        before = self.val_history[0] if self.val_history else None
        if before is None and t.val_before_train and self.val_ds is not None:
            before = self.validate()
            self.log(before)
        step_metrics: list[dict[str, float]] = []
        try:
            while self.step < t.total_steps and (t.total_epochs is None or self.loader.epoch < t.total_epochs):
                m = self.train_step()
                if t.val_freq and self.step % t.val_freq == 0 and self.step < t.total_steps:
                    val = self.validate()
                    m.update(val)
                    self._act_on([self.guard.observe("validation", val, self.step)], m)
                    m.update(self.guard.pop_metrics())
                step_metrics.append(m)
                self.log(m)
                if t.save_freq and self.step % t.save_freq == 0:
                    self.save_checkpoint()
            after = self.validate() if self.val_ds is not None else {}
            if after:
                self.log(after)
            latest = self.ckpt.latest()
            if latest is None or latest.name != self.ckpt.name_of(self.step):  # the last step is not saved yet
                self.save_checkpoint()
        except WorkerDiedError as e:
            last = self.ckpt.latest()
            where = (f"The last checkpoint, {last}, is intact: run the same command with --resume to continue from it."
                     if last else "No checkpoint was written yet (trainer.save_freq sets how often); --resume would start from step 0.")
            raise WorkerDiedError(f"step {self.step + 1}: {e} {where}") from e
        finally:
            for tr in self.trackers:
                tr.close()
        summary = self._summary(before, after, step_metrics)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
        return summary

    def _summary(self, before, after, steps) -> dict[str, Any]:
        timing = {}
        for m in steps:
            for k, v in m.items():
                if k.startswith("timing_s/"):
                    timing.setdefault(k, []).append(v)
        return {
            "steps": self.step, "wall_s": time.perf_counter() - self.t_start, "startup_s": self.startup_s,
            "val_before": before, "val_after": after,
            "timing_s_mean": {k: float(np.mean(v)) for k, v in timing.items()},
            "final_score_mean": steps[-1].get("critic/score/mean") if steps else None,
            "train_rows": len(self.train_ds.rows), "train_dropped_too_long": self.train_ds.dropped_too_long, "train_skipped_invalid": self.train_ds.skipped,
            "checkpoint": str(self.ckpt.latest()) if self.ckpt.latest() else None,
        }

    def close(self) -> None:
        self.rewards.close()
        for g in self._groups():
            g.shutdown()
        torch.set_num_threads(self._threads_before)


def print_summary(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    c = Console(highlight=False, soft_wrap=True)
    table = Table(title=f"ARMOR run: {summary['steps']} steps in {summary['wall_s']:.1f} s")
    table.add_column("")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    b, a = summary.get("val_before") or {}, summary.get("val_after") or {}
    for k in sorted(set(b) | set(a)):
        if k.startswith("val/") and "acc" in k:
            table.add_row(k, f"{b[k]:.3f}" if k in b else "-", f"{a[k]:.3f}" if k in a else "-")
    c.print(table)
    t = summary["timing_s_mean"]
    if t:
        c.print("seconds per step by stage: " + ", ".join(f"{k.split('/')[-1]} {v:.3f}" for k, v in sorted(t.items(), key=lambda kv: -kv[1])))
    c.print(f"start-up: ray {summary['startup_s']['ray_init']:.1f} s, workers {summary['startup_s']['workers']:.1f} s; checkpoint: {summary['checkpoint']}")


def run_training(cfg: ArmorConfig, resume: bool = False) -> dict[str, Any]:
    trainer = Trainer(cfg, resume=resume)
    try:
        summary = trainer.fit()
    finally:
        trainer.close()
    print_summary(summary)
    return summary
