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


def test_before_finds_the_newest_checkpoint_older_than_a_step(tmp_path):
    ck = CheckpointManager(tmp_path, keep=3)
    for step in (10, 20, 30):
        ck.save(step, lambda d: None, {"step": step})
    (ck.root / "step_000040.tmp").mkdir()  # unfinished: never a candidate
    assert [p.name for p in ck.completed()] == ["step_000010", "step_000020", "step_000030"]
    assert ck.before(31).name == "step_000030"
    assert ck.before(30).name == "step_000020"  # step_30 holds the weights of update 30, the suspect
    assert ck.before(11).name == "step_000010"
    assert ck.before(10) is None


def test_rollback_restores_a_checkpoint_from_before_the_suspected_update(tmp_path, capsys):
    """A collapse noticed at step 64 that began with update 60 must not restore step_60 (saved after the damage)."""
    from types import SimpleNamespace

    from armor_core.trainer import Trainer

    ck = CheckpointManager(tmp_path, keep=2)
    for step in (50, 60):
        ck.save(step, lambda d: None, {"step": step})
    loaded = []
    trainer = Trainer.__new__(Trainer)  # the rollback logic only: no workers
    trainer.ckpt, trainer.step = ck, 64
    trainer.cfg = SimpleNamespace(trainer=SimpleNamespace(keep_checkpoints=2))
    trainer.loader = SimpleNamespace(state_dict=lambda: {"pos": 64}, load_state_dict=lambda s: loaded.append(("loader", s)))
    trainer._load = lambda path, restore_guards=True: loaded.append(path.name)
    # a generation already queued for the next step came from the weights being discarded: its
    # prompts are kept (the loader has moved past them), its samples are not
    from armor_core.trainer import _Queued

    trainer._queued = _Queued(gen_in="next prompts", out="samples of the discarded weights")
    metrics = {}
    trainer._rollback(metrics, since=60)
    assert loaded == ["step_000050", ("loader", {"pos": 64})] and metrics["guard/rollback"] == 1.0
    assert trainer._queued == _Queued(gen_in="next prompts", out=None)
    assert trainer.step == 64  # the clock and the data position do not rewind
    loaded.clear()
    trainer._rollback(metrics)  # no suspicion named: the newest
    assert loaded[0] == "step_000060"
    loaded.clear()
    trainer._rollback(metrics, since=50)  # nothing older is kept: the oldest, with a warning
    assert loaded[0] == "step_000050" and "may already be affected" in capsys.readouterr().out
