"""How a run starts its workers: which groups it needs and how many of each, the cores every worker gets, the
isolation plan, the Ray cluster, and one constructor for every group (``Launch.group``), so the actor, critic,
teacher and rollout groups are built alike. ``Trainer._start_workers`` reads as the list of groups it starts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from armor_core.config.schema import ArmorConfig, to_dict
from armor_core.engine import WorkerGroup

if TYPE_CHECKING:
    from armor_core.engine.isolation import ProcessIsolator
    from armor_core.rewards.placement import WorkerScorer

__all__ = ["Launch", "plan_launch"]


@dataclass
class Launch:
    """A run's worker groups as planned: ``groups`` (name -> worker count), ``cpus`` per worker, the isolation
    ``plan`` (name -> each rank's constructor arguments; empty when nothing is pinned) and its ``isolator``."""

    cfg: ArmorConfig
    groups: dict[str, int]
    cpus: float
    plan: dict[str, list[dict]] = field(default_factory=dict)
    isolator: ProcessIsolator | None = None
    conf: dict[str, Any] = field(default_factory=dict)  # the config the workers are built from, set by start_cluster

    def start_cluster(self) -> float:
        """Start (or join) Ray with the workers' OpenMP wait policy and check that it can hold every group; the
        seconds it took."""
        import ray

        from armor_core.engine import init_ray, wait_policy
        from armor_core.engine.cluster import check_capacity

        e = self.cfg.engine
        t0 = time.perf_counter()
        policy = wait_policy(e.omp_wait_policy)
        if policy == "passive" and e.omp_wait_policy == "auto":
            print("other processes keep this machine's cores busy: the workers' OpenMP threads sleep while they wait")
        init_ray(e.address, e.num_cpus, sum(self.groups.values()) * self.cpus, e.connect_timeout_s, policy)
        alive = [nd["Resources"] for nd in ray.nodes() if nd.get("Alive")]
        check_capacity(alive, self.groups, self.cpus, e.gpus_per_worker)
        self.conf = to_dict(self.cfg)
        return time.perf_counter() - t0

    def group(
        self,
        worker_cls: type,
        name: str,
        api: type,
        init_kwargs: dict[str, Any] | None = None,
        channel: bool | None = None,
    ) -> WorkerGroup:
        """The group ``name`` of ``worker_cls`` workers, called through ``api``, on its planned cores and devices;
        built from the run's config unless ``init_kwargs`` say otherwise; over the direct channel unless
        ``channel`` is False."""
        e = self.cfg.engine
        return WorkerGroup(
            worker_cls,
            self.groups[name],
            cpus_per_worker=self.cpus,
            gpus_per_worker=e.gpus_per_worker,
            name=name,
            api=api,
            init_kwargs={"config": self.conf} if init_kwargs is None else init_kwargs,
            rank_kwargs=self.plan.get(name),
            channel=e.direct_channel if channel is None else channel,
        )

    def record_isolation(self, groups: list[WorkerGroup], run_dir: Path) -> None:
        """``isolation.json``: what each worker applied, and where Ray placed it (node id and IP, pid)."""
        records = [{**place, **rec} for g in groups for place, rec in zip(g.placement, g.call(g.api.isolation_record))]
        if self.isolator is not None:
            self.isolator.report(records, run_dir)  # printed, and saved as isolation.json
            return
        from armor_core.engine.isolation import write_assignment

        # on a joined cluster the driver cannot know which cores another node's raylet (or the other
        # raylets on one machine) hands out, so nothing is pinned; workers still run cpus_per_worker threads
        e = self.cfg.engine
        reason = "joined Ray cluster (engine.address): cores are not pinned" if e.address else "engine.isolate=false"
        write_assignment(run_dir, [{**r, "isolated": False, "reason": reason} for r in records])


def plan_launch(cfg: ArmorConfig, requires_critic: bool, reward_models: dict[str, WorkerScorer]) -> Launch:
    """The groups a run needs (the actor; a critic when the estimator ``requires_critic``; rollout workers in async
    mode; a teacher for distillation; one group per reward model placed on a worker), the cores each worker gets
    (``engine.cpus_per_worker``, or this machine's cores shared out, written back to the config, which the workers
    read their thread count from) and, with ``engine.isolate`` on a local cluster, the isolation plan: made before
    any worker starts, so two workers on one core are an error now, not a slow run later."""
    from armor_core.engine.isolation import ProcessIsolator, detect_available_cpus

    e, a = cfg.engine, cfg.actor
    groups = {
        "actor": a.num_workers,
        **({"critic": cfg.critic.num_workers or a.num_workers} if requires_critic else {}),
        **({"rollout": cfg.rollout.num_workers} if cfg.rollout.mode == "async" else {}),
        **({"teacher": cfg.algorithm.distill.num_workers} if cfg.algorithm.distill.teacher else {}),
    }
    groups.update({name: 1 for name in reward_models})
    cpus = e.cpus_per_worker or max(1, len(detect_available_cpus()) // sum(groups.values()))
    cfg.engine.cpus_per_worker = cpus
    launch = Launch(cfg, groups, cpus)
    if e.isolate and not e.address:
        launch.isolator = ProcessIsolator(cpus, e.gpus_per_worker, cfg.trainer.seed)
        for asg in launch.isolator.plan(groups):
            assignment = {"group": asg.group, "rank": asg.rank, "cpus": list(asg.cpus), "gpus": list(asg.gpus)}
            launch.plan.setdefault(asg.group, []).append({"assignment": {**assignment, "node": asg.node}})
    return launch
