"""Checkpoints are atomic: a crash mid-save leaves the previous one usable; old ones are pruned."""

from __future__ import annotations

import pytest

from armor_core.checkpoint import CheckpointManager


def test_save_latest_and_prune(tmp_path):
    ck = CheckpointManager(tmp_path, keep=2)
    assert ck.latest() is None
    for step in (1, 2, 3):
        ck.save(step, lambda d, s=step: (d / "w.txt").write_text(str(s)), {"step": step})
    assert ck.latest().name == "step_000003"
    assert ck.trainer_state(ck.latest()) == {"step": 3}
    assert sorted(p.name for p in ck.root.glob("step_*")) == ["step_000002", "step_000003"]


def test_crash_during_save_keeps_the_previous_checkpoint(tmp_path):
    ck = CheckpointManager(tmp_path, keep=3)
    ck.save(1, lambda d: (d / "w.txt").write_text("one"), {"step": 1})

    def crash(d):
        (d / "w.txt").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        ck.save(2, crash, {"step": 2})
    latest = ck.latest()
    assert latest.name == "step_000001" and (latest / "w.txt").read_text() == "one"
    # a stale pointer (e.g. to a directory removed by hand) falls back to the newest complete one
    (ck.root / "latest").write_text("step_000009")
    assert ck.latest().name == "step_000001"
