"""A job stopped after a checkpoint and started again with the same ``armor run`` command
(``trainer.resume=auto``) goes on from that checkpoint, and ends with the weights an uninterrupted run ends with.

The stop is an interrupt raised on the driver the moment step 2's checkpoint is on disk (``armor run`` exits 130,
as a job stopped by a signal does); a worker killed mid-run and resumed is ``tests/e2e/test_worker_death.py``.
"""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from armor_core.cli.main import main
from armor_core.storage.checkpoint import CheckpointManager

pytestmark = pytest.mark.slow


def _steps(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in rows if "actor/pg_loss" in r]


def _weights(run_dir):
    return load_file(run_dir / "checkpoints" / "step_000003" / "model" / "model.safetensors")


def test_a_stopped_run_started_again_with_the_same_command_continues_from_its_checkpoint(
    ray_cluster, tmp_path, monkeypatch, capsys, tiny_run
):
    base = ["run", *tiny_run, "trainer.total_steps=3", "trainer.save_freq=1", "trainer.resume=auto"]
    whole = tmp_path / "whole"
    assert main([*base, f"trainer.run_dir={whole}"]) == 0
    assert f"trainer.resume=auto: no checkpoint in {whole / 'checkpoints'}; starting from step 0" in (
        capsys.readouterr().out
    )

    save = CheckpointManager.save

    def save_then_stop(self, step, *args, **kwargs):
        path = save(self, step, *args, **kwargs)
        if step == 2:
            raise KeyboardInterrupt  # the job's stop signal, once step 2 is on disk
        return path

    run_dir = tmp_path / "stopped"
    command = [*base, f"trainer.run_dir={run_dir}"]
    monkeypatch.setattr(CheckpointManager, "save", save_then_stop)
    assert main(command) == 130
    monkeypatch.undo()
    assert _steps(run_dir) == [1, 2] and (run_dir / "checkpoints" / "latest").read_text() == "step_000002"
    logged = (run_dir / "metrics.jsonl").read_text()

    capsys.readouterr()
    assert main(command) == 0  # the same command line, nothing added
    out = capsys.readouterr().out
    assert f"trainer.resume=auto: resumed from {run_dir / 'checkpoints' / 'step_000002'} at step 2" in out
    assert _steps(run_dir) == [1, 2, 3]
    # steps 1 and 2 were not trained again: their rows (timings included) are the ones written before the stop
    assert (run_dir / "metrics.jsonl").read_text().startswith(logged)
    state = json.loads((run_dir / "checkpoints" / "step_000003" / "trainer_state.json").read_text())
    assert state["step"] == 3 and state["loader"]["position"] == 6  # 3 steps x 2 prompts through the data
    expected, got = _weights(whole), _weights(run_dir)
    assert expected.keys() == got.keys()
    different = [name for name in expected if not expected[name].equal(got[name])]
    assert different == []  # bit for bit the uninterrupted run's step-3 weights
