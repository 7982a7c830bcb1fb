"""Checkpoints are atomic: a crash mid-save leaves the previous one usable; old ones are pruned."""

from __future__ import annotations

import pytest

from armor_core.storage.checkpoint import CheckpointManager
from armor_core.testing.damage import CHECKPOINT_DAMAGE


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

    from armor_core.loop.rollback import RollbackPoints, Trainables
    from armor_core.loop.trainer import Trainer

    ck = CheckpointManager(tmp_path, keep=2)
    for step in (50, 60):
        ck.save(step, lambda d: None, {"step": step})
    loaded = []
    trainer = Trainer.__new__(Trainer)  # the rollback logic only: no workers
    trainer.ckpt, trainer.step = ck, 64
    trainer.cfg = SimpleNamespace(
        trainer=SimpleNamespace(keep_checkpoints=2), rollout=SimpleNamespace(multi_turn=SimpleNamespace(enable=False))
    )
    trainer.loader = SimpleNamespace(
        state_dict=lambda: {"pos": 64}, load_state_dict=lambda s: loaded.append(("loader", s))
    )
    trainer._load = lambda path, resume=True: loaded.append(path.name)
    trainer.points = RollbackPoints(Trainables(None), tmp_path, every=0, store="auto")  # none kept
    # a generation already queued for the next step came from the weights being discarded: its
    # prompts are kept (the loader has moved past them), its samples are not
    from armor_core.loop.rollout_source import RolloutSource, _Queued

    trainer.rollout = RolloutSource(trainer.cfg, actor=None, loader=trainer.loader, faults=None)
    trainer.rollout.queued = _Queued(gen_in="next prompts", out="samples of the discarded weights")
    metrics = {}
    trainer._rollback(metrics, since=60)
    assert loaded == ["step_000050", ("loader", {"pos": 64})] and metrics["guard/rollback"] == 1.0
    assert trainer.rollout.queued == _Queued(gen_in="next prompts", out=None)
    assert trainer.step == 64  # the clock and the data position do not rewind
    loaded.clear()
    trainer._rollback(metrics)  # no suspicion named: the newest
    assert loaded[0] == "step_000060"
    loaded.clear()
    trainer._rollback(metrics, since=50)  # nothing older is kept: the oldest, with a warning
    assert loaded[0] == "step_000050" and "may already be affected" in capsys.readouterr().out


def _save_two(tmp_path):
    """step_1 and step_2, each with a model file, an optimizer state and an RNG file, as a worker writes them."""

    def write(d, s):
        (d / "model").mkdir()
        (d / "model" / "model.safetensors").write_bytes(bytes([s]) * 4096)
        (d / "actor_state.safetensors").write_bytes(b"optimizer" * 100 + bytes([s]))
        (d / "actor_state.json").write_text('{"format": 1, "state": {"optimizer": {"__tensor__": "optimizer"}}}')
        (d / "actor_rng_rank0.safetensors").write_bytes(b"rng")
        (d / "actor_rng_rank0.json").write_text('{"format": 1, "state": {"torch_rng": {"__tensor__": "torch_rng"}}}')

    ck = CheckpointManager(tmp_path, keep=3)
    for step in (1, 2):
        ck.save(step, lambda d, s=step: write(d, s), {"step": step, "loader": {"position": 4 * step}})
    return ck.root / "step_000002"


@pytest.mark.parametrize("damage", list(CHECKPOINT_DAMAGE))
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one_with_a_warning(tmp_path, damage):
    from armor_core.storage.checkpoint import CheckpointWarning

    newest = _save_two(tmp_path)
    rel, hurt = CHECKPOINT_DAMAGE[damage]
    hurt(newest / rel)
    ck = CheckpointManager(tmp_path, keep=3)  # a new process, as on --resume
    with pytest.warns(CheckpointWarning, match=rf"step_000002 is damaged and is skipped: {rel}"):
        latest = ck.latest()
    assert latest.name == "step_000001" and ck.trainer_state(latest)["step"] == 1
    assert [p.name for p in ck.completed()] == ["step_000001"]
    assert ck.before(3).name == "step_000001"  # a rollback skips it too


def test_no_intact_checkpoint_stops_with_an_error_naming_each_damaged_file(tmp_path):
    from armor_core.errors import UserFacingError
    from armor_core.storage.checkpoint import CheckpointError

    newest = _save_two(tmp_path)
    (newest / "model" / "model.safetensors").write_bytes(b"")
    (newest.parent / "step_000001" / "actor_state.safetensors").unlink()
    ck = CheckpointManager(tmp_path)
    with (
        pytest.warns(UserWarning),
        pytest.raises(
            CheckpointError,
            match=r"no intact checkpoint in .*checkpoints \(step_000002: model/model.safetensors has 0 bytes.*"
            r"step_000001: actor_state.safetensors is missing\)",
        ) as err,
    ):
        ck.latest()
    assert isinstance(err.value, UserFacingError)  # the CLI prints it as one line, exit code 2


def test_save_fsyncs_every_file_and_directory_and_writes_the_manifest_before_the_rename(tmp_path, monkeypatch):
    import hashlib
    import json
    import os

    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))
    )
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(a))), real_replace(a, b)))
    ck = CheckpointManager(tmp_path)
    ck.save(1, lambda d: ((d / "model").mkdir(), (d / "model" / "w.bin").write_bytes(b"abc")), {"step": 1})
    tmp = str(ck.root / "step_000001.tmp")
    rename = events.index(("replace", tmp))
    synced = {path for kind, path in events[:rename] if kind == "fsync"}
    assert {f"{tmp}/model/w.bin", f"{tmp}/trainer_state.json", f"{tmp}/manifest.json", f"{tmp}/model", tmp} <= synced
    manifest = json.loads((ck.root / "step_000001" / "manifest.json").read_text())
    assert manifest["files"]["model/w.bin"] == {"size": 3, "sha256": hashlib.sha256(b"abc").hexdigest()}
    assert set(manifest["files"]) == {"model/w.bin", "trainer_state.json"}


def test_a_checkpoint_without_a_manifest_is_used_with_a_warning(tmp_path):
    from armor_core.storage.checkpoint import CheckpointWarning

    old = tmp_path / "checkpoints" / "step_000005"  # as written before manifests existed
    old.mkdir(parents=True)
    (old / "trainer_state.json").write_text('{"step": 5}')
    with pytest.warns(CheckpointWarning, match="has no manifest.json"):
        assert CheckpointManager(tmp_path).latest() == old


def test_a_full_disk_names_the_directory_and_keeps_the_previous_checkpoint(tmp_path):
    import errno

    from armor_core.storage.checkpoint import CheckpointError

    ck = CheckpointManager(tmp_path, keep=2)
    ck.save(1, lambda d: (d / "w.txt").write_text("one"), {"step": 1})

    def full(d):
        (d / "w.txt").write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(
        CheckpointError,
        match=rf"the disk holding {tmp_path / 'checkpoints'} is full.*checkpoint step_000002 could not "
        r"be written.*the previous checkpoint, step_000001, is left as it was",
    ):
        ck.save(2, full, {"step": 2})
    assert not list(ck.root.glob("*.tmp")) and CheckpointManager(tmp_path).latest().name == "step_000001"


def test_a_full_disk_is_recognised_through_a_worker_error_and_torch_s_wording(tmp_path, monkeypatch):
    import errno

    from armor_core.storage import checkpoint
    from armor_core.storage.checkpoint import CheckpointError

    ck = CheckpointManager(tmp_path)

    def from_worker(d):  # the channel raises the worker's exception as itself, chained to nothing here
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise RuntimeError("save_checkpoint failed on rank 1") from e

    with pytest.raises(CheckpointError, match="is full"):
        ck.save(1, from_worker, {"step": 1})

    def torch_save(d):  # torch.save says nothing of ENOSPC; the free space does
        raise RuntimeError(
            "[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0; PytorchStreamWriter failed "
            "writing file data/0"
        )

    monkeypatch.setattr(checkpoint, "_free_bytes", lambda path: 1 << 20)
    with pytest.raises(
        CheckpointError, match=r"is full \(1 MiB left\).*no earlier checkpoint exists.*PytorchStreamWriter"
    ):
        ck.save(1, torch_save, {"step": 1})
    monkeypatch.setattr(checkpoint, "_free_bytes", lambda path: 10 << 30)
    with pytest.raises(
        RuntimeError, match="PytorchStreamWriter"
    ) as err:  # plenty of space: some other failure, shown as it is
        ck.save(1, torch_save, {"step": 1})
    assert not isinstance(err.value, CheckpointError)


def test_pruning_keeps_intact_checkpoints_over_a_damaged_newer_one(tmp_path):
    ck = CheckpointManager(tmp_path, keep=2)
    for step in (10, 20):
        ck.save(step, lambda d: (d / "w.bin").write_bytes(b"x" * 64), {"step": step})
    (ck.root / "step_000020" / "w.bin").write_bytes(b"")  # damaged; the run resumes from step 10
    ck = CheckpointManager(tmp_path, keep=2)
    with pytest.warns(UserWarning):
        assert ck.latest().name == "step_000010"
    ck.save(15, lambda d: (d / "w.bin").write_bytes(b"y" * 64), {"step": 15})
    assert sorted(p.name for p in ck.root.glob("step_*")) == ["step_000010", "step_000015", "step_000020"]
    ck.save(17, lambda d: (d / "w.bin").write_bytes(b"z" * 64), {"step": 17})
    assert sorted(p.name for p in ck.root.glob("step_*")) == ["step_000015", "step_000017", "step_000020"]
    assert ck.latest().name == "step_000017"


@pytest.mark.parametrize(
    "damage", ["one flipped byte in the weights", "truncated weights", "deleted trainer_state.json"]
)
def test_export_refuses_a_checkpoint_that_fails_its_manifest_and_writes_nothing(tmp_path, capsys, damage):
    import shutil

    from armor_core.cli.main import main
    from armor_core.models.loading import resolve_model_path
    from armor_core.storage.checkpoint import CheckpointError, check_intact

    def write(d):
        shutil.copytree(resolve_model_path("builtin:arithmetic-tiny"), d / "model")

    ckpt = CheckpointManager(tmp_path / "run").save(1, write, {"step": 1})
    check_intact(ckpt)  # as written: intact
    assert main(["export", str(ckpt), str(tmp_path / "good")]) == 0
    rel, hurt = CHECKPOINT_DAMAGE[damage]
    hurt(ckpt / rel)
    with pytest.raises(CheckpointError, match=f"{ckpt.name} is damaged: {rel}"):
        check_intact(ckpt)
    capsys.readouterr()
    assert main(["export", str(ckpt), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: checkpoint {ckpt} is damaged: {rel}") and not (tmp_path / "out").exists()


def test_only_a_run_checkpoints_model_or_adapter_directory_is_taken_for_a_checkpoint(tmp_path):
    from armor_core.storage.checkpoint import checkpoint_of

    ckpt = CheckpointManager(tmp_path / "run").save(1, lambda d: (d / "model").mkdir(), {"step": 1})
    assert checkpoint_of(ckpt / "model") == ckpt and checkpoint_of(str(ckpt / "adapter")) == ckpt
    hf = tmp_path / "checkpoint-500"  # a Hugging Face Trainer's: the model and its own trainer_state.json together
    hf.mkdir()
    (hf / "trainer_state.json").write_text('{"global_step": 500}')
    assert checkpoint_of(hf) is None and checkpoint_of(tmp_path / "elsewhere" / "model") is None
