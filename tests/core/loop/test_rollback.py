"""Rollback points on the driver: when one is kept, where, which state a rollback restores (a point or a
checkpoint, whichever is the newest older than the verdict's ``since``), and that a point on disk is never a
checkpoint ``--resume`` would take."""

from __future__ import annotations

import json

import pytest

from armor_core.loop.rollback import MEMORY_LIMIT, RollbackPoints, rollback_target
from armor_core.storage.checkpoint import CheckpointManager


class Workers:
    """Stands in for ``Trainables``: records what the workers were asked to do."""

    def __init__(self, point_bytes: int = 3 << 20) -> None:
        self.calls: list[tuple] = []
        self.bytes = point_bytes

    def point_bytes(self) -> dict[str, int]:
        return {"actor": self.bytes, "critic": self.bytes // 2}

    def keep_point(self, step: int, keep: list[int]) -> None:
        self.calls.append(("keep", step, keep))

    def restore_point(self, step: int) -> None:
        self.calls.append(("restore", step))

    def save(self, path) -> None:
        (path / "weights.safetensors").write_bytes(b"w" * 16)

    def load(self, path, rollback: bool = False) -> None:
        self.calls.append(("load", path.name, rollback))


def _state(step: int) -> dict:
    return {"step": step, "loader": {"pos": step}, "guard": {}, "val_history": []}


def test_a_point_is_kept_at_the_first_step_then_every_n_and_two_stay(tmp_path, capsys):
    workers = Workers()
    points = RollbackPoints(workers, tmp_path, every=10, store="auto")
    assert capsys.readouterr().out == (
        "rollback points: in memory, every 10 steps (2 kept), 3.0 MiB per actor rank, 1.5 MiB per critic rank\n"
    )
    kept = []
    for step in range(0, 31):
        if points.due(step):
            state = _state(step)
            assert points.keep(step, state) >= 0.0
            state["loader"]["pos"] = -1  # the live object moves on; the point does not
            kept.append(step)
    assert kept == [0, 10, 20, 30]
    # each worker forgets what the driver no longer counts on before it copies: never three in memory
    assert workers.calls == [("keep", 0, []), ("keep", 10, [0]), ("keep", 20, [10]), ("keep", 30, [20])]
    assert points.steps() == [20, 30] and points.states[20]["loader"] == {"pos": 20}
    assert not (tmp_path / "rollback").exists() and not (tmp_path / "checkpoints").exists()


def test_no_guard_that_rolls_back_keeps_nothing_and_asks_the_workers_nothing(tmp_path, capsys):
    workers = Workers()
    points = RollbackPoints(workers, tmp_path, every=0, store="memory")
    assert not any(points.due(step) for step in range(100))
    assert workers.calls == [] and points.steps() == [] and capsys.readouterr().out == ""


def test_a_rollback_restores_the_newest_point_or_checkpoint_older_than_since(tmp_path, capsys):
    ckpt = CheckpointManager(tmp_path, keep=5)
    for step in (15, 20):
        ckpt.save(step, lambda d: None, _state(step))
    workers = Workers()
    points = RollbackPoints(workers, tmp_path, every=10, store="memory")
    for step in (10, 20):
        points.keep(step, _state(step))

    def target(since):
        t = rollback_target(ckpt, points, since, 24)
        return t.name if hasattr(t, "name") else t

    assert target(None) == 20  # a point and a checkpoint of one step: the point, faster to restore
    assert target(20) == "step_000015"  # the checkpoint is newer than the older point
    assert target(12) == 10
    capsys.readouterr()
    assert target(8) == 10 and "no checkpoint or rollback point older than step 8" in capsys.readouterr().out

    assert points.restore(10) == _state(10) and workers.calls[-1] == ("restore", 10)
    assert points.steps() == [10]  # point 20 held the discarded weights
    points.keep(30, _state(30))
    assert workers.calls[-1] == ("keep", 30, [10])

    empty = RollbackPoints(Workers(), tmp_path / "other", every=10, store="memory")
    assert rollback_target(CheckpointManager(tmp_path / "other"), empty, None, 3) is None


def test_points_on_disk_are_written_as_checkpoints_elsewhere_and_never_resumed_from(tmp_path, capsys):
    (tmp_path / "rollback" / "step_000007").mkdir(parents=True)  # an earlier process's: not this run's
    workers = Workers(point_bytes=MEMORY_LIMIT + 1)
    points = RollbackPoints(workers, tmp_path, every=2, store="auto")  # too big for memory
    assert capsys.readouterr().out.startswith(f"rollback points: on disk in {tmp_path / 'rollback'}, every 2 steps")
    assert not (tmp_path / "rollback").exists()
    for step in (0, 2, 4):
        points.keep(step, _state(step))
    assert points.steps() == [2, 4]
    assert sorted(p.name for p in (tmp_path / "rollback").iterdir()) == ["latest", "step_000002", "step_000004"]
    manifest = json.loads((tmp_path / "rollback" / "step_000004" / "manifest.json").read_text())
    assert "weights.safetensors" in manifest["files"]  # verified like a checkpoint
    assert CheckpointManager(tmp_path).latest() is None  # what --resume reads: nothing
    from armor_core.storage.run_dir import check_new_run

    check_new_run(tmp_path)  # nor does a new run in this directory take it for a run's checkpoint

    assert points.restore(2) == _state(2) and workers.calls == [("load", "step_000002", True)]
    assert points.steps() == [2] and not (tmp_path / "rollback" / "step_000004").exists()


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_the_store_named_is_the_one_used_whatever_the_size(tmp_path, store):
    size = MEMORY_LIMIT * 4 if store == "memory" else 1
    assert RollbackPoints(Workers(size), tmp_path, every=10, store=store).store == store
