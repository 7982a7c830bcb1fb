"""The RL loop on the driver. One step:

1. take a batch of prompts, repeat each ``rollout.n`` times (interleaved, so a group is contiguous);
2. generate responses in the actor workers (the rollout engine lives there), or, with
   ``rollout.mode=async``, take a batch rollout workers of their own generated meanwhile
   (``async_rollout.py``);
3. score each row with the reward domain its ``data_source`` routes to; the score sits on the last
   response token; with ``algorithm.filter_groups``, drop groups that all scored alike and repeat
   1-3 until the batch is full;
4. old log-probs (skipped when the update is exactly on-policy), reference log-probs (when KL is
   used), values (when the estimator ``requires_critic``), the teacher's log-probs (``algorithm.distill``,
   a teacher worker group of its own); KL and the distillation signal folded into the reward if configured;
5. advantages from the configured estimator (one greedy response per prompt first, scored, when it
   reads a ``greedy_baseline``: ReMax);
6. critic update, actor update;
7. the StabilityGuard looks at each stage and may skip the update or roll back;
8. new weights to the rollout engine; metrics; checkpoint and validation on schedule.

The driver holds no model (only a tokenizer, to decode responses for the reward). It never asks
which algorithm it runs: the estimator, losses, KL estimators, guards and rollout backend are
plugins looked up by their config names, and their metadata (``requires_critic``, ``greedy_baseline``) decides what
gets built.

Long module: ``Trainer`` owns the run's state (step, histories, checkpoints, rollback, validation, trackers); its
collaborators (``startup``, ``step``, ``rollout_source``, ``rollback``, ``data``) are modules of their own, and what
is left reads that state in every method.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from armor_core.config.schema import ArmorConfig, to_dict
from armor_core.config.written import for_trackers
from armor_core.engine import WorkerDiedError, WorkerGroup
from armor_core.errors import NonFiniteError
from armor_core.interfaces import capability
from armor_core.loop.baseline import GreedyBaseline
from armor_core.loop.data import load_data
from armor_core.loop.guard_defaults import model_guards
from armor_core.loop.resume import check_lora_base, nothing_left, resumed_by
from armor_core.loop.rollback import RollbackPoints, Trainables, rollback_target
from armor_core.loop.rollout_source import RolloutSource
from armor_core.loop.step import Scorer, Step, batch_metrics, send_adjustments, update_stats
from armor_core.loop.step_timer import ENGINE_STAGES
from armor_core.loop.summary import print_summary
from armor_core.models.weight_sums import SyncCheckError
from armor_core.workers.api import ActorAPI, CriticAPI, RolloutAPI, TeacherAPI
from armor_core.workers.losses.rollout_correction import nothing_kept

__all__ = ["Trainer", "run_training"]


class Trainer:
    _saving: Path | None = None  # a checkpoint whose shards are written in the background (trainer.async_save)

    def __init__(self, cfg: ArmorConfig, resume: bool = False) -> None:
        from armor_core.config.plugin_checks import validate_plugins
        from armor_core.models.loading import load_tokenizer, resolve_model_path
        from armor_core.plugins import get_plugin_manager
        from armor_core.rewards.manager import RewardManager
        from armor_core.stability.guard import GuardRunner, run_coefficients
        from armor_core.storage.checkpoint import CheckpointManager
        from armor_core.storage.run_dir import check_new_run

        cfg.guard.guards = model_guards(cfg)  # the default stack gains expert_collapse for an MoE model
        self.cfg, self.t_start = cfg, time.perf_counter()
        self.run_dir = Path(cfg.trainer.run_dir)
        self.pm = get_plugin_manager()
        # every way of starting a run comes here (armor run, tests, benchmarks); the CLI checks only for --dry-run
        validate_plugins(cfg, self.pm)
        self.resumed_by = resumed_by(cfg, resume)  # --resume, trainer.resume=auto, or None: a new run
        resume = self.resumed_by is not None
        if not resume:
            check_new_run(cfg.trainer.run_dir)
        else:
            check_lora_base(cfg)
        self.estimator = self.pm.get(
            "advantage_estimator", cfg.algorithm.adv_estimator, where="algorithm.adv_estimator"
        )
        self.tokenizer = load_tokenizer(
            cfg.model.tokenizer_path or resolve_model_path(cfg.model.path),
            trust_remote_code=cfg.model.trust_remote_code,
        )
        self.rewards = RewardManager(
            cfg.reward, self.pm, watch_failures=True
        )  # a domain failing on most rows stops the run
        self.scorer = Scorer(self.rewards, self.tokenizer)
        self.train_ds, self.val_ds, self.loader = load_data(cfg, self.pm, self.tokenizer, self.rewards)
        self.ckpt = CheckpointManager(self.run_dir, cfg.trainer.keep_checkpoints)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # written once every check passed, the workers' included: a refused --resume leaves the run's config as it was
        config_json = json.dumps(to_dict(cfg), indent=1)
        self.guard = GuardRunner(
            cfg.guard.guards, self.pm, self.run_dir, enable=cfg.guard.enable, run_values=run_coefficients(cfg.actor)
        )
        from armor_core.stability.faults import Faults

        self.faults = Faults(cfg.trainer.faults)
        self.kl_ctrl = None
        if cfg.algorithm.use_kl_in_reward:
            from armor_core.loop.kl_penalty import build_kl_controller

            a = cfg.algorithm
            self.kl_ctrl = build_kl_controller(a.kl_ctrl_type, a.kl_coef, a.kl_target, a.kl_horizon)
        logged = for_trackers(cfg)  # ${oc.env:...} values as written, never the secrets they resolve to
        self.trackers = [self.pm.get("metric_tracker", name)(self.run_dir, logged) for name in cfg.trainer.loggers]
        self._log_s = 0.0  # seconds the trackers spent since the last step began
        self.step = 0
        self.history: list[dict[str, float]] = []
        self.val_history: list[dict[str, float]] = []
        # the driver's tensors are small; its extra torch threads would only spin on the workers'
        # cores. Set back by close(), or here if starting fails.
        self._threads_before = torch.get_num_threads()
        torch.set_num_threads(cfg.engine.driver_threads)
        self._start(resume, config_json)

    # -- setup ----------------------------------------------------------------------------------

    def _start(self, resume: bool, config_json: str) -> None:
        """Start the workers and the rollback points, load the checkpoint on ``--resume``, open the guard's events and
        write ``config.json``; on any failure, stop what started (a checkpoint that does not fit this config: free
        the workers' cores before saying why)."""
        try:
            self._start_workers()
            g = self.cfg.guard
            self.points = RollbackPoints(
                self.trainables, self.run_dir, g.rollback_every if self.guard.rolls_back() else 0, g.rollback_store
            )
            if resume:
                # the steps after the checkpoint are logged again; without one, all of them (step 0's validation too)
                since = self.step if self._resume() else -1
                for tracker in self.trackers:
                    if (rewind := capability("metric_tracker", tracker, "resume")) is not None:
                        rewind(since)
                self.guard.forget_after(since)
            self.guard.open_events()  # there from the start, empty until a guard acts; a resume's is kept
            (self.run_dir / "config.json").write_text(config_json)
        except (
            BaseException
        ):  # e.g. a checkpoint that does not fit this config: free the workers' cores before saying why
            for group in self._groups():
                group.shutdown()
            for tracker in self.trackers:
                tracker.close()
            torch.set_num_threads(self._threads_before)
            raise

    def _start_workers(self) -> None:
        from armor_core.loop.startup import plan_launch
        from armor_core.rewards.placement import worker_scorers
        from armor_core.workers.actor.worker import ActorWorker
        from armor_core.workers.critic.worker import CriticWorker
        from armor_core.workers.reward_model import start_reward_workers

        reward_models = worker_scorers(self.rewards.config_domains)  # reward.model/judge entries placed on workers
        launch = plan_launch(self.cfg, self.estimator.requires_critic, reward_models)
        self.startup_s = {"ray_init": launch.start_cluster()}
        t0 = time.perf_counter()
        self.actor = launch.group(ActorWorker, "actor", ActorAPI, {"config": launch.conf, "run_dir": str(self.run_dir)})
        self.critic = launch.group(CriticWorker, "critic", CriticAPI) if "critic" in launch.groups else None
        self.distill = None
        if "teacher" in launch.groups:
            from armor_core.loop.distill import Distillation
            from armor_core.workers.teacher import TeacherWorker

            self.distill = Distillation(self.cfg, launch.group(TeacherWorker, "teacher", TeacherAPI))
        self.async_rollout = None
        if "rollout" in launch.groups:
            from armor_core.loop.async_rollout import AsyncRollout
            from armor_core.workers.rollout.worker import RolloutWorker

            # channel=False: Ray runs a rollout worker's calls in the order sent, weight pushes between generations
            group = launch.group(RolloutWorker, "rollout", RolloutAPI, channel=False)
            r = self.cfg.rollout
            self.async_rollout = AsyncRollout(
                group, self.actor, self.loader, r.n, r.max_staleness, multi_turn=r.multi_turn.enable
            )
        self.reward_workers = start_reward_workers(
            reward_models,
            launch.plan,
            cpus=launch.cpus,
            gpus=self.cfg.engine.gpus_per_worker,
            config=launch.conf,
            timeout_s=self.cfg.reward.timeout_s,
        )
        self.startup_s["workers"] = time.perf_counter() - t0
        self._build_step()
        launch.record_isolation(self._groups(), self.run_dir)

    def _build_step(self) -> None:
        """The driver's collaborators over the started groups: what checkpoints hold, where rows come from, the step."""
        self.trainables = Trainables(self.actor, self.critic)  # what checkpoints and rollback points hold
        # a colocated engine that does not share the actor's module (vllm, FSDP2's full copy) needs its weights sent
        self.rollout = RolloutSource(
            self.cfg,
            self.actor,
            self.loader,
            self.faults,
            self.async_rollout,
            any(self.actor.call(ActorAPI.needs_weight_sync)),
        )
        self.stepper = Step(
            self.cfg,
            self.pm,
            self.estimator,
            self.actor,
            self.critic,
            self.rollout,
            self.scorer,
            self.guard,
            self.faults,
            self.kl_ctrl,
            self.distill,
            GreedyBaseline(self.rollout, self.scorer, self.cfg.rollout.multi_turn.enable)
            if self.estimator.greedy_baseline
            else None,
        )

    def _groups(self) -> list[WorkerGroup]:
        return [
            g
            for g in (
                getattr(self, "actor", None),
                getattr(self, "critic", None),
                getattr(getattr(self, "distill", None), "group", None),
                getattr(getattr(self, "async_rollout", None), "group", None),
                *getattr(self, "reward_workers", []),
            )
            if g is not None
        ]

    def _resume(self) -> bool:
        """Load the latest checkpoint; False when there is none (the run starts over)."""
        path = self.ckpt.latest()
        if path is None:
            print(f"{self.resumed_by}: no checkpoint in {self.ckpt.root}; starting from step 0")
            return False
        self._load(path)
        print(f"{self.resumed_by}: resumed from {path} at step {self.step}")
        return True

    def _load(self, path: Path, resume: bool = True) -> None:
        """Weights, optimizer and trainer state from checkpoint ``path``; on a ``resume`` also the
        guards' state (the workers' too), the learning rates and the async batches in flight (a rollback keeps
        what the guards learned, e.g. how often they rolled back, and the rates they set, and regenerates)."""
        self.trainables.load(path, rollback=not resume)
        self._set_state(self.ckpt.trainer_state(path), path if resume else None)

    def _set_state(self, state: dict[str, Any], resumed_from: Path | None) -> None:
        """The driver's part of a checkpoint or rollback point (``trainer_state``); the guards' state and the
        async batches in flight only on a resume from checkpoint ``resumed_from``."""
        self.step = int(state["step"])
        self.loader.load_state_dict(state["loader"])
        self.rollout.reset(resumed_from)
        if resumed_from is not None:
            self.guard.load_state_dict(state.get("guard", {}))
        if self.kl_ctrl is not None and "kl_ctrl" in state:
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        self.val_history = state.get("val_history", [])

    def trainer_state(self) -> dict[str, Any]:
        """What the driver keeps in a checkpoint or rollback point: step, data position, guards, KL controller and
        validation history."""
        return {
            "step": self.step,
            "loader": self.rollout.loader_state(),
            "guard": self.guard.state_dict(),
            "val_history": self.val_history,
            **({"kl_ctrl": self.kl_ctrl.state_dict()} if self.kl_ctrl else {}),
        }

    def save_checkpoint(self, background: bool = False) -> Path:
        """The checkpoint of this step; with ``background`` (``trainer.async_save``) its shards are still being
        written when this returns the directory they go to (``step_N.tmp``), and ``finish_save`` makes it one."""
        self.finish_save()

        def write(tmp: Path) -> None:
            self.trainables.save(tmp, background)
            self.rollout.save(tmp)

        if not background:
            return self.ckpt.save(self.step, write, self.trainer_state())
        self._saving = self.ckpt.begin(self.step, write, self.trainer_state())
        return self._saving

    def finish_save(self) -> float:
        """Make the checkpoint whose shards are written in the background one (once they are); the seconds waited."""
        if self._saving is None:
            return 0.0
        tmp, self._saving = self._saving, None
        waited = [0.0]
        self.ckpt.finish(tmp, lambda: waited.__setitem__(0, self.trainables.wait_saved()))
        return waited[0]

    # -- one step -------------------------------------------------------------------------------

    def train_step(self) -> dict[str, float]:
        """One step (``step.Step.run``), then the ``update`` stage shown to the guards and their verdicts acted on."""
        t_step = time.perf_counter() - self._log_s
        # after the last step's validation and verdicts: a point never holds weights a verdict condemned
        kept_s = self.points.keep(self.step, self.trainer_state()) if self.points.due(self.step) else 0.0
        res = self.stepper.run(self.step + 1)
        # the trackers' time on the metrics logged since the last step began (a step's metrics are
        # logged after it ends): engine time every step costs, so it is part of the step
        res.timer.add("log", self._log_s)
        if self.points.every:
            res.timer.add("rollback_point", kept_s)
        self._log_s = 0.0
        self.step += 1
        metrics = res.metrics
        if res.batch is not None:
            after = [self.guard.observe("update", update_stats(metrics), self.step)] if res.updated else []
            self._act_on([*res.verdicts, *after], metrics)
            assert res.scores is not None  # the step scored what it trained on
            metrics.update(batch_metrics(res.batch, res.scores))
            a = self.cfg.algorithm
            if warning := nothing_kept(metrics, self.step, a.rollout_correction, a.rollout_correction_cap):
                print(warning)
            metrics["training/epoch"] = float(self.loader.epoch)
        metrics.update(res.timer.t)
        metrics.update(self.guard.pop_metrics())
        step_s = time.perf_counter() - t_step
        metrics["timing_s/step"] = step_s
        metrics["timing_s/other"] = step_s - sum(res.timer.t.values())
        metrics["perf/engine_overhead_frac"] = sum(metrics.get(f"timing_s/{k}", 0.0) for k in ENGINE_STAGES) / step_s
        if res.batch is not None:
            n_tokens = float(res.batch["attention_mask"].sum())
            metrics["perf/total_num_tokens"] = n_tokens
            metrics["perf/throughput"] = n_tokens / step_s
        return metrics

    def _act_on(self, verdicts: list, metrics: dict[str, float]) -> None:
        """Roll back if any guard asked, then apply every adjustment (after: a rollback restores the old optimizer)."""
        rollbacks = [v for v in verdicts if v.action == "rollback"]
        if rollbacks:
            sinces = [v.since for v in rollbacks if v.since is not None]
            self._rollback(metrics, min(sinces) if sinces else None)
        send_adjustments(self.actor, verdicts, metrics)  # applied from the next update on, identically on every rank

    def _rollback(self, metrics: dict[str, float], since: int | None = None) -> None:
        """Restore the newest rollback point or checkpoint older than ``since`` (the first suspected update), or the
        newest of all."""
        metrics["guard/rollback"] = 1.0
        self.finish_save()  # a checkpoint still being written: whole, and a target, before anything is loaded
        target = rollback_target(self.ckpt, self.points, since, self.step)
        if target is None:
            print(
                f"step {self.step}: the guard asked for a rollback but no checkpoint or rollback point exists yet "
                f"(guard.rollback_every={self.points.every}); the update was skipped"
            )
            return
        position, step = self.loader.state_dict(), self.step
        self.rollout.forget_samples()  # generated by the weights just discarded: its prompts are sampled again
        if isinstance(target, Path):
            self._load(target, resume=False)
            self.points.forget_after(self.step)
            name = target.name
        else:
            self._set_state(self.points.restore(target), None)
            name = f"the rollback point of step {target} ({self.points.store})"
        # roll back the weights, not the data or the clock: the offending batches are skipped and
        # step numbers stay monotonic in the logs (a rollback is an event at this step)
        self.loader.load_state_dict(position)
        self.step = step
        print(f"step {self.step}: rolled back to {name}")

    # -- validation -----------------------------------------------------------------------------

    def validate(self) -> dict[str, float]:
        """Held-out metrics (``validation.run_validation``): greedy accuracy per data source, and
        ``mean@n`` / ``best@n`` / ``maj@n`` with ``trainer.val_n > 1``."""
        if self.val_ds is None:
            return {}
        from armor_core.dataproto.protocol import DataProto
        from armor_core.loop.validation import run_validation

        enc = self.val_ds.encoded
        data = DataProto.from_dict(tensors=dict(enc["tensors"]), non_tensors=dict(enc["non_tensors"]))
        t = self.cfg.trainer
        out = run_validation(
            data,
            lambda prompts, greedy: self.rollout.generate(prompts, self.step, greedy=greedy),
            self.scorer,
            self.rollout.ranks,
            t.val_n,
            t.val_sampled,
            multi_turn=self.cfg.rollout.multi_turn.enable,
        )
        out["val/step"] = float(self.step)
        self.val_history.append(out)
        return out

    # -- the loop -------------------------------------------------------------------------------

    def log(self, metrics: dict[str, float]) -> None:
        t0 = time.perf_counter()
        for name, t in zip(self.cfg.trainer.loggers, self.trackers):
            with self._disk_full_is_an_error(f"tracker {name!r} could not log step {self.step}"):
                t.log(metrics, self.step)
        self._log_s += time.perf_counter() - t0  # charged to the next step (see train_step)

    @contextmanager
    def _disk_full_is_an_error(self, what: str) -> Iterator[None]:
        """A full disk under a tracker's write is the one-line error a checkpoint's gets, not a traceback."""
        from armor_core.storage.checkpoint import disk_full_error

        try:
            yield
        except OSError as e:
            last = self.ckpt.latest()
            kept = f"the last checkpoint, {last.name}, is intact" if last else "no checkpoint was written yet"
            error = disk_full_error(e, self.run_dir, f"{what} (nothing partial was kept); {kept}")
            if error is None:
                raise
            raise error from e

    def fit(self) -> dict[str, Any]:
        t = self.cfg.trainer
        before = self.val_history[0] if self.val_history else None
        if before is None and t.val_before_train and self.val_ds is not None:
            before = self.validate()
            # the guards see it too: the level a validation later in the run is measured against
            self._act_on([self.guard.observe("validation", before, self.step)], before)
            before.update(self.guard.pop_metrics())
            self.log(before)
        step_metrics: list[dict[str, float]] = []
        try:
            while self.step < t.total_steps and (t.total_epochs is None or self.loader.epoch < t.total_epochs):
                m = self.train_step()
                if self._saving is not None:  # an earlier step's checkpoint, written while this step ran
                    m["timing_s/save_wait"] = self.finish_save()
                if t.val_freq and self.step % t.val_freq == 0 and self.step < t.total_steps:
                    val = self.validate()
                    m.update(val)
                    self._act_on([self.guard.observe("validation", val, self.step)], m)
                    m.update(self.guard.pop_metrics())
                step_metrics.append(m)
                self.log(m)
                if t.save_freq and self.step % t.save_freq == 0:
                    self.save_checkpoint(background=t.async_save)
            after = self.validate() if self.val_ds is not None else {}
            if after:
                self.log(after)
            self.finish_save()
            latest = self.ckpt.latest()
            if latest is None or latest.name != self.ckpt.name_of(self.step):  # the last step is not saved yet
                self.save_checkpoint()
            summary = self._summary(before, after, step_metrics)
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
            for tr in self.trackers:  # optional: trackers that keep a run summary (wandb, mlflow)
                if (keep := capability("metric_tracker", tr, "summary")) is not None:
                    keep(summary)
        except WorkerDiedError as e:
            last = self.ckpt.latest()
            again = "again" if self.cfg.trainer.resume == "auto" else "with --resume"
            where = (
                f"The last checkpoint, {last}, is intact: run the same command {again} to continue from it."
                if last
                else "No checkpoint was written yet (trainer.save_freq sets how often); --resume would start from "
                "step 0."
            )
            raise WorkerDiedError(f"step {self.step + 1}: {e} {where}") from e
        except NonFiniteError as e:
            raise NonFiniteError(f"step {self.step + 1}: {e}") from None
        except SyncCheckError as e:  # the engine would sample from another policy than the one trained
            self.guard.record_stop(self.step + 1, "sync", "weight_sync", str(e))
            raise
        finally:
            for name, tr in zip(t.loggers, self.trackers):
                with self._disk_full_is_an_error(f"tracker {name!r} could not be closed"):
                    tr.close()
        return summary

    def _summary(self, before, after, steps) -> dict[str, Any]:
        timing = {}
        for m in steps:
            for k, v in m.items():
                if k.startswith("timing_s/"):
                    timing.setdefault(k, []).append(v)
        return {
            "steps": self.step,
            "wall_s": time.perf_counter() - self.t_start,
            "startup_s": self.startup_s,
            "val_before": before,
            "val_after": after,
            "timing_s_mean": {k: float(np.mean(v)) for k, v in timing.items()},
            "final_score_mean": steps[-1].get("critic/score/mean") if steps else None,
            "train_rows": len(self.train_ds.rows),
            "train_dropped_too_long": self.train_ds.dropped_too_long,
            "train_skipped_invalid": self.train_ds.skipped,
            "checkpoint": str(self.ckpt.latest()) if self.ckpt.latest() else None,
        }

    def close(self) -> None:
        self.rewards.close()
        for g in self._groups():
            g.shutdown()
        torch.set_num_threads(self._threads_before)


def run_training(cfg: ArmorConfig, resume: bool = False) -> dict[str, Any]:
    """Train the run ``cfg`` describes and print its summary; a resume (``resume``, or ``trainer.resume=auto``) with
    nothing left to train says so and returns ``{}`` (``loop/resume.py``)."""
    by = resumed_by(cfg, resume)
    if by is not None and (done := nothing_left(cfg, by)):
        print(done)
        return {}
    trainer = Trainer(cfg, resume=resume)
    try:
        summary = trainer.fit()
    finally:
        trainer.close()
    print_summary(summary)
    return summary
