"""The run directory: one run at a time, no new run over a run's checkpoints, and a resume that keeps the
config the run started with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from armor_core.config.schema import load_config, to_dict
from armor_core.storage.run_dir import RunDirError, RunDirLock, check_new_run, check_resume_config, config_changes


def _started(tmp_path, *overrides):
    cfg = load_config(None, [f"trainer.run_dir={tmp_path}", *overrides])
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(to_dict(cfg), indent=1))  # as the trainer writes it


def test_config_changes_compares_leaf_keys_a_list_or_dict_whole():
    saved = {"a": {"b": 1, "c": [1, 2], "kw": {"x": 1}}, "d": "x"}
    current = {"a": {"b": 2, "c": [1, 2], "kw": {"x": 1, "y": 2}}, "d": "x", "e": 0}
    # e: absent from the saved config (a key added since): not a change
    assert config_changes(saved, current, ["a.b", "a.c", "a.kw", "d", "e"]) == ["a.b", "a.kw"]


def test_a_resume_with_a_changed_config_names_the_keys_unless_allowed(tmp_path):
    _started(tmp_path, "actor.lr=1e-5")
    changed = to_dict(
        load_config(
            None, [f"trainer.run_dir={tmp_path}", "actor.lr=2e-5", "trainer.seed=7", "data.train_batch_size=32"]
        )
    )
    with pytest.raises(
        RunDirError,
        match=r"data.train_batch_size \(16 -> 32\), actor.lr \(1e-05 -> 2e-05\), trainer.seed \(1 -> 7\).*"
        r"--allow-config-change data.train_batch_size,actor.lr,trainer.seed",
    ):
        check_resume_config(tmp_path, changed)
    with pytest.raises(RunDirError, match=r"trainer.seed \(1 -> 7\)\. "):
        check_resume_config(tmp_path, changed, ["actor.lr", "data"])  # a section allows its keys
    assert check_resume_config(tmp_path, changed, ["actor.lr", "data", "trainer.seed"]) == [
        "data.train_batch_size: 16 -> 32",
        "actor.lr: 1e-05 -> 2e-05",
        "trainer.seed: 1 -> 7",
    ]


def test_running_longer_elsewhere_or_logging_otherwise_needs_no_permission(tmp_path):
    _started(tmp_path)
    longer = load_config(
        None,
        [
            f"trainer.run_dir={tmp_path}",
            "trainer.total_steps=500",
            "trainer.save_freq=5",
            "engine.num_cpus=8",
            "trainer.loggers=[jsonl]",
            "trainer.allow_legacy_pt_state=true",
        ],
    )
    assert check_resume_config(tmp_path, to_dict(longer)) == []
    assert check_resume_config(tmp_path / "never_started", to_dict(longer)) == []


def test_the_cli_refuses_a_changed_resume_before_starting_anything(tmp_path, capsys):
    from armor_core.cli.main import main

    _started(tmp_path)
    assert main(["run", "--dry-run", "--resume", f"trainer.run_dir={tmp_path}", "actor.lr=1e-3"]) == 2
    assert "--allow-config-change actor.lr" in capsys.readouterr().err
    assert main(["run", "--dry-run", f"trainer.run_dir={tmp_path}", "--allow-config-change", "actor.lr"]) == 2
    assert "applies to --resume (or trainer.resume=auto) only" in capsys.readouterr().err


def test_one_run_at_a_time_in_a_run_directory(tmp_path):
    import os

    with RunDirLock(tmp_path / "run"):
        with pytest.raises(
            RunDirError, match=rf"{tmp_path / 'run'} is in use by another armor run \(pid {os.getpid()}\)"
        ):
            with RunDirLock(tmp_path / "run"):
                pass
    with RunDirLock(tmp_path / "run"):  # released when the first run ended
        pass


def test_a_new_run_refuses_a_run_directory_that_holds_checkpoints(tmp_path, capsys):
    from armor_core.cli.main import main
    from armor_core.loop.trainer import Trainer
    from armor_core.storage.checkpoint import CheckpointManager

    check_new_run(tmp_path)  # no checkpoint yet
    CheckpointManager(tmp_path).save(1, lambda d: (d / "w.bin").write_bytes(b"w"), {"step": 1})
    message = (
        f"{tmp_path} already holds checkpoints; pass --resume to continue that run, or choose another trainer.run_dir"
    )
    with pytest.raises(RunDirError) as e:
        check_new_run(tmp_path)
    assert str(e.value) == message
    # the trainer asks first, before it loads a tokenizer or data or starts a worker; so does --dry-run
    with pytest.raises(RunDirError, match="pass --resume"):
        Trainer(load_config(None, [f"trainer.run_dir={tmp_path}"]))
    assert main(["run", "--dry-run", f"trainer.run_dir={tmp_path}"]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_a_run_dir_that_names_a_file_is_refused_before_anything_is_written(tmp_path, capsys):
    from armor_core.cli.main import main

    notes = tmp_path / "notes.txt"
    notes.write_text("a file")
    for run_dir, what in ((notes, "is not a directory"), (notes / "run", f"lies under {notes}, which is not a")):
        with pytest.raises(RunDirError, match=rf"trainer.run_dir={run_dir} {what}"):
            with RunDirLock(run_dir):
                pass
        with pytest.raises(RunDirError, match="give a directory"):
            check_new_run(run_dir)
        assert main(["run", "--dry-run", f"trainer.run_dir={run_dir}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: trainer.run_dir={run_dir} ") and err.count("\n") == 1
    assert notes.read_text() == "a file" and sorted(tmp_path.iterdir()) == [notes]


def test_a_run_dir_the_kernel_refuses_to_create_is_an_error_naming_it():
    run_dir = Path("/proc/self/armor_run")  # /proc takes no new directories, whoever asks (root too)
    with pytest.raises(RunDirError, match=rf"trainer.run_dir={run_dir}: cannot create {run_dir}/.lock \("):
        with RunDirLock(run_dir):
            pass
