"""Rollback points: what a guard's rollback restores when the run has no checkpoint recent enough.

A ``rollback`` verdict restores the newest state older than its ``since`` (``Trainer._rollback``). Checkpoints are
written every ``trainer.save_freq`` steps, and by default only at the end, so the trainer keeps states of its own
for rollbacks, whatever ``save_freq`` says: when a configured guard may ask for a rollback the driver carries out
(``GuardRunner.rolls_back``: a guard whose ``actions`` list ``rollback`` at stage ``reward``, ``advantage``,
``update`` or ``validation``, or one that declares no ``actions``) and ``guard.rollback_every`` is above 0, a point
is kept at the run's first step and then every ``rollback_every`` steps. It is kept as a step begins, after the
previous step's validation and verdicts, so a point never holds weights a verdict already condemned. Two are kept:
a verdict's ``since`` may condemn the newest. With no such guard nothing is kept and nothing is paid.

A point holds what a checkpoint holds: every actor and critic rank's weights, optimizer state, schedule and RNG
(``TrainableAPI``), and the driver's part, ``Trainer.trainer_state`` (data position, guards, KL controller,
validation history), kept as the JSON a checkpoint writes. Where (``guard.rollback_store``):

- ``memory``: each rank copies its own state into host memory (``workers/rollback_point.py``), its shards under
  FSDP2: no gather, no file. The driver keeps its part.
- ``disk``: the checkpoint writer (``Trainables.save``, ``CheckpointManager``) into ``<run_dir>/rollback/``: not
  counted against ``trainer.keep_checkpoints``, never read by ``--resume`` (which reads ``checkpoints/``), and
  removed when a run starts (an earlier process's points are not this run's).
- ``auto``: memory while a point of one rank is at most ``MEMORY_LIMIT`` (2 GiB: about 180M trained parameters with
  AdamW's two moments, 12 bytes each), else disk. Copying 2 GiB in host memory takes a fraction of a second, while
  the checkpoint writer hashes and fsyncs every byte it writes; past that size two points per rank start to compete
  with the model, the Ray object store and the rollout engine for host memory, and the disk is the safer place.

The restore keeps the learning rate in force and the guards' state (``rollback_point.rates_kept``); the points
after the one restored are forgotten, since they hold the weights the rollback discarded. What it costs: one line
at start (the store and a point's size) and ``timing_s/rollback_point``, the seconds each step spent keeping one
(0 on the others), inside ``timing_s/step``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from armor_core.workers.api import TrainableAPI

if TYPE_CHECKING:
    from armor_core.engine import WorkerGroup
    from armor_core.storage.checkpoint import CheckpointManager

__all__ = ["KEPT", "MEMORY_LIMIT", "RollbackPoints", "Trainables", "rollback_target"]

#: the most bytes a rollback point of one rank may hold for ``guard.rollback_store=auto`` to keep it in memory
MEMORY_LIMIT = 2 << 30
#: rollback points kept: a verdict's ``since`` may condemn the newest one
KEPT = 2


class Trainables:
    """The trained worker groups, called together: the actor, and the critic when the estimator needs one."""

    def __init__(self, actor: WorkerGroup, critic: WorkerGroup | None = None) -> None:
        self.groups = [g for g in (actor, critic) if g is not None]

    def save(self, path: Path, background: bool = False) -> None:
        """Each group's checkpoint files into ``path`` (rank 0 writes, every rank takes part in the gathers; a sharded
        checkpoint's shards, with ``background``, written on after this returns: ``wait_saved``)."""
        for group in self.groups:
            group.call(TrainableAPI.save_checkpoint, str(path), background)

    def wait_saved(self) -> float:
        """Return once every group's background writes are done; the longest any rank waited, in seconds."""
        return max((max(group.call(TrainableAPI.wait_saved)) for group in self.groups), default=0.0)

    def load(self, path: Path, rollback: bool = False) -> None:
        """Each group's state from checkpoint ``path``; a ``rollback`` keeps the rates and guard state in force."""
        for group in self.groups:
            group.call(TrainableAPI.load_checkpoint, str(path), rollback)

    def point_bytes(self) -> dict[str, int]:
        """Per group, the largest rank's in-memory rollback point, in bytes."""
        return {group.name: max(group.call(TrainableAPI.rollback_point_bytes)) for group in self.groups}

    def keep_point(self, step: int, keep: list[int]) -> None:
        for group in self.groups:
            group.call(TrainableAPI.keep_rollback_point, step, keep)

    def restore_point(self, step: int) -> None:
        for group in self.groups:
            group.call(TrainableAPI.restore_rollback_point, step)


class RollbackPoints:
    """The rollback points of a run (see the module docstring).

    :param every: ``guard.rollback_every``, or 0 when no configured guard may roll back (nothing is kept).
    :param store: ``guard.rollback_store``: ``auto``, ``memory`` or ``disk``.
    """

    def __init__(self, trainables: Trainables, run_dir: Path, every: int, store: str) -> None:
        from armor_core.storage.checkpoint import CheckpointManager

        self.trainables, self.every = trainables, every
        self.states: dict[int, dict[str, Any]] = {}  # in memory: the driver's part of each point, by step
        self.disk = CheckpointManager(run_dir, keep=KEPT, folder="rollback")
        shutil.rmtree(self.disk.root, ignore_errors=True)  # an earlier process's points are not this run's
        self.store = None
        if not every:
            return
        sizes = trainables.point_bytes()
        if store == "auto":
            store = "memory" if max(sizes.values()) <= MEMORY_LIMIT else "disk"
        self.store = store
        where = "in memory" if store == "memory" else f"on disk in {self.disk.root}"
        each = ", ".join(f"{n / 2**20:.1f} MiB per {name} rank" for name, n in sizes.items())
        print(f"rollback points: {where}, every {every} steps ({KEPT} kept), {each}")

    def due(self, step: int) -> bool:
        """Whether a point is to be kept as step ``step + 1`` begins: the first, then every ``every`` steps."""
        if not self.every:
            return False
        newest = self.steps()[-1:]
        return not newest or step - newest[0] >= self.every

    def keep(self, step: int, state: dict[str, Any]) -> float:
        """Keep the point of ``step`` (the weights after that step's update) with the driver's ``state``; the
        seconds it took."""
        t0 = time.perf_counter()
        if self.store == "memory":
            keep = self.steps()[1 - KEPT :] if KEPT > 1 else []  # the newest KEPT - 1 stay beside the new one
            self.trainables.keep_point(step, keep)
            # as a checkpoint would hold it: nothing kept here changes with the live objects it came from
            self.states = {s: self.states[s] for s in keep} | {step: json.loads(json.dumps(state))}
        else:
            self.disk.save(step, self.trainables.save, state)
        return time.perf_counter() - t0

    def steps(self) -> list[int]:
        """The steps of the points kept, oldest first."""
        if self.store == "memory":
            return sorted(self.states)
        return [self.disk.step_of(p) for p in self.disk.completed()] if self.store == "disk" else []

    def newest_before(self, since: int | None) -> int | None:
        """The step of the newest point older than ``since`` (the newest of all when None); None if there is none."""
        older = [s for s in self.steps() if since is None or s < since]
        return older[-1] if older else None

    def restore(self, step: int) -> dict[str, Any]:
        """Put the point of ``step`` back into the workers and forget the points after it; returns the driver's
        part, for the trainer to set as it sets a checkpoint's."""
        if self.store == "memory":
            self.trainables.restore_point(step)
            state = self.states[step]
        else:
            path = self.disk.root / self.disk.name_of(step)
            self.trainables.load(path, rollback=True)
            state = self.disk.trainer_state(path)
        self.forget_after(step)
        return state

    def forget_after(self, step: int) -> None:
        """Forget the points after ``step``: a rollback to ``step`` discarded the weights they hold. (In memory the
        workers drop theirs when the next point is kept.)"""
        self.states = {s: v for s, v in self.states.items() if s <= step}
        if self.store == "disk":
            self.disk.remove_after(step)


def rollback_target(ckpt: CheckpointManager, points: RollbackPoints, since: int | None, step: int) -> Path | int | None:
    """What a rollback at ``step`` restores: the newest checkpoint (a path) or rollback point (a step) older than
    ``since`` (the newest of all when None), the rollback point when both are of one step (it is the faster to
    restore); without one older than ``since``, the oldest of either, said to be possibly affected; None if there
    is neither."""
    path = ckpt.latest() if since is None else ckpt.before(since)
    point = points.newest_before(since)
    if point is not None and (path is None or point >= ckpt.step_of(path)):
        return point
    if path is not None or since is None:
        return path
    oldest: list[Path | int] = [*ckpt.completed()[:1], *points.steps()[:1]]
    if not oldest:
        return None
    target = min(oldest, key=lambda t: ckpt.step_of(t) if isinstance(t, Path) else t)
    what = target.name if isinstance(target, Path) else f"the rollback point of step {target}"
    print(
        f"step {step}: no checkpoint or rollback point older than step {since} is kept "
        f"(trainer.keep_checkpoints={ckpt.keep}, {KEPT} rollback points); rolling back to the oldest one, {what}, "
        "which may already be affected"
    )
    return target
