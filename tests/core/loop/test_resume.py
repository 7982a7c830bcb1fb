"""What a resume settles before any worker starts, and a full disk under the trainer's trackers:
no Ray here (the whole runs are in tests/e2e/test_train.py)."""

from __future__ import annotations

import errno
import json

import pytest

from armor_core.config.schema import load_config, to_dict
from armor_core.loop.resume import nothing_left
from armor_core.storage.checkpoint import CheckpointManager


def _finished_run(run, step=2, epoch=0, *overrides):
    """A run directory as a run of ``step`` steps leaves it: its config.json and a checkpoint."""
    cfg = load_config(None, [f"trainer.run_dir={run}", f"trainer.total_steps={step}", *overrides])
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))
    (run / "metrics.jsonl").write_text('{"step": 0, "val/acc_greedy": 0.5}\n')
    state = {"step": step, "loader": {"epoch": epoch, "position": 8, "seed": 1}}
    CheckpointManager(run).save(step, lambda d: (d / "weights.json").write_text("{}"), state)
    return cfg


def test_nothing_is_left_at_the_end_of_steps_or_epochs(tmp_path):
    _finished_run(tmp_path / "r", 2, 1)
    at = lambda *o: nothing_left(load_config(None, [f"trainer.run_dir={tmp_path / 'r'}", *o]))  # noqa: E731
    assert at("trainer.total_steps=2").startswith(
        f"--resume: the latest checkpoint, {tmp_path / 'r' / 'checkpoints' / 'step_000002'}, is at step 2, and "
        "trainer.total_steps=2 ends the run there; nothing to train and nothing was written. Raise trainer.total_steps"
    )
    assert at("trainer.total_steps=1") is not None  # already past it
    assert at("trainer.total_steps=3") is None
    assert "trainer.total_epochs=1 ends the run" in at("trainer.total_steps=9", "trainer.total_epochs=1")
    assert at("trainer.total_steps=9", "trainer.total_epochs=2") is None
    assert nothing_left(load_config(None, [f"trainer.run_dir={tmp_path / 'empty'}"])) is None  # no checkpoint


def test_armor_run_resume_past_the_end_says_so_and_writes_nothing(tmp_path, capsys):
    from armor_core.cli.main import main

    run = tmp_path / "r"
    _finished_run(run)
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main(["run", "--resume", f"trainer.run_dir={run}", "trainer.total_steps=2"]) == 0
    assert "is at step 2, and trainer.total_steps=2 ends the run there; nothing to train" in capsys.readouterr().out
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert {k: v for k, v in after.items() if k.name != ".lock"} == before  # no row, no config.json, no tracker file


AUTO = ["trainer.resume=auto", "trainer.save_freq=1"]


def test_auto_resume_resumes_where_a_checkpoint_is_and_starts_fresh_where_none_is(tmp_path):
    from armor_core.loop.resume import has_checkpoint, resumed_by

    fresh = load_config(None, [f"trainer.run_dir={tmp_path / 'empty'}", *AUTO])
    assert resumed_by(fresh, False) == "trainer.resume=auto" and not has_checkpoint(fresh)
    assert nothing_left(fresh, "trainer.resume=auto") is None  # nothing to resume: the run starts at step 0
    assert resumed_by(load_config(None, []), False) is None and resumed_by(load_config(None, []), True) == "--resume"
    cfg = _finished_run(tmp_path / "r", 2, 0, *AUTO)
    assert has_checkpoint(cfg)
    assert nothing_left(cfg, "trainer.resume=auto").startswith("trainer.resume=auto: the latest checkpoint, ")


def test_armor_run_with_auto_checks_the_config_only_when_there_is_a_checkpoint(tmp_path, capsys):
    from armor_core.cli.main import main

    # a run that died before its first checkpoint left its config.json: with no checkpoint there, a changed config
    # is a new start (its rows are dropped when it starts), not a resume to refuse
    (tmp_path / "started").mkdir()
    (tmp_path / "started" / "config.json").write_text(json.dumps(to_dict(load_config(None, ["actor.lr=1e-3"]))))
    assert main(["run", "--dry-run", *AUTO, f"trainer.run_dir={tmp_path / 'started'}"]) == 0
    # with a checkpoint, exactly --resume's check: the same config passes, a changed one is refused naming the key
    _finished_run(tmp_path / "r", 2, 0, *AUTO)
    capsys.readouterr()
    assert main(["run", "--dry-run", *AUTO, f"trainer.run_dir={tmp_path / 'r'}", "trainer.total_steps=4"]) == 0
    assert main(["run", "--dry-run", *AUTO, f"trainer.run_dir={tmp_path / 'r'}", "actor.lr=1e-3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: trainer.resume=auto with a config that differs from the one ") and (
        "actor.lr (5e-05 -> 0.001)" in err and "--allow-config-change actor.lr" in err
    )
    argv = ["run", "--dry-run", *AUTO, f"trainer.run_dir={tmp_path / 'r'}", "actor.lr=1e-3"]
    assert main([*argv, "--allow-config-change", "actor.lr"]) == 0
    assert "trainer.resume=auto: config changed as allowed: actor.lr: 5e-05 -> 0.001" in capsys.readouterr().out
    # a run started without the key may be continued with it, and the other way round
    assert main(["run", "--dry-run", "--resume", f"trainer.run_dir={tmp_path / 'r'}", "trainer.save_freq=1"]) == 0


def test_armor_run_with_auto_of_a_finished_run_says_so_and_writes_nothing(tmp_path, capsys):
    # a batch job requeued after its run ended: the same command is a no-op, exit 0
    from armor_core.cli.main import main

    run = tmp_path / "r"
    _finished_run(run, 2, 0, *AUTO)
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main(["run", *AUTO, f"trainer.run_dir={run}", "trainer.total_steps=2"]) == 0
    assert "trainer.resume=auto: the latest checkpoint, " in capsys.readouterr().out
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert {k: v for k, v in after.items() if k.name != ".lock"} == before


class _FullDisk:
    def log(self, metrics, step):
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self):
        pass


def test_a_full_disk_under_a_tracker_is_the_checkpoint_s_one_line_error(tmp_path):
    from armor_core.loop.trainer import Trainer
    from armor_core.storage.checkpoint import DiskFullError

    cfg = _finished_run(tmp_path / "r", 2, 0, "trainer.loggers=[jsonl]")
    trainer = Trainer.__new__(Trainer)  # the logging collaborators alone, no workers
    trainer.cfg, trainer.run_dir, trainer.step, trainer._log_s = cfg, tmp_path / "r", 3, 0.0
    trainer.ckpt, trainer.trackers = CheckpointManager(tmp_path / "r"), [_FullDisk()]
    with pytest.raises(DiskFullError) as e:
        trainer.log({"a": 1.0})
    assert str(e.value).startswith(
        f"the disk holding {tmp_path / 'r'} is full ("
    ) and "MiB left): tracker 'jsonl' could not log step 3 (nothing partial was kept); the last checkpoint, " in str(
        e.value
    )
    assert "step_000002, is intact. Free space there (or lower trainer.keep_checkpoints) and run again with " in str(
        e.value
    )
