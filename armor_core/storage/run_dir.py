"""Guard rails of a run directory: one run writes into it at a time, a new run does not start over
a run's checkpoints, and ``--resume`` (or ``trainer.resume=auto``) continues with the config the run was started
with.

``RunDirLock`` holds an exclusive ``flock`` on ``<run_dir>/.lock`` for as long as the run lives;
the kernel drops it when the process ends however it ends (``kill -9`` included), so a stale
lock never blocks a resume. ``check_new_run`` refuses a run directory that holds checkpoints to a
run started without ``--resume`` or ``trainer.resume=auto`` (the trainer asks it first; ``armor run --dry-run``
asks it too).
``check_resume_config`` compares the config of a resume with the run's ``config.json`` and refuses
keys that changed, unless the user allowed them by name (``armor run --resume --allow-config-change
actor.lr,data.train_batch_size``). Keys that only say how long, where or how observably the run goes
on (``ALWAYS_ALLOWED``) may change freely.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

from armor_core.errors import UserFacingError

__all__ = [
    "ALWAYS_ALLOWED",
    "RunDirError",
    "RunDirLock",
    "check_new_run",
    "check_resume_config",
    "check_run_dir_path",
    "config_changes",
]

# continuing a run for longer, on other machines, with other logging, checkpoint or validation
# schedules or fault injections changes nothing about the updates made so far
ALWAYS_ALLOWED = (
    "trainer.run_dir",
    "trainer.total_steps",
    "trainer.total_epochs",
    "trainer.save_freq",
    "trainer.async_save",
    "trainer.keep_checkpoints",
    "trainer.resume",
    "trainer.allow_legacy_pt_state",
    "trainer.val_freq",
    "trainer.val_before_train",
    "trainer.val_sampled",
    "trainer.loggers",
    "trainer.faults",
    "engine",
)


class RunDirError(UserFacingError):
    """The run directory is in use by another run, holds checkpoints a new run would overwrite, or a
    resume would silently change its config."""


def check_new_run(run_dir: str | Path) -> None:
    """A run started without ``--resume`` must not write over checkpoints: ``RunDirError`` if ``run_dir`` holds any."""
    from armor_core.storage.checkpoint import CheckpointManager

    check_run_dir_path(run_dir)
    if CheckpointManager(run_dir).latest() is not None:
        raise RunDirError(
            f"{run_dir} already holds checkpoints; pass --resume to continue that run, "
            "or choose another trainer.run_dir"
        )


def check_run_dir_path(run_dir: str | Path) -> None:
    """``RunDirError`` when ``run_dir`` cannot be a directory: it, or the nearest part of it that exists, is a file."""
    path = Path(run_dir)
    for part in (path, *path.parents):
        if part.is_dir():
            return
        if part.exists() or part.is_symlink():
            what = "is not a directory" if part == path else f"lies under {part}, which is not a directory"
            raise RunDirError(f"trainer.run_dir={run_dir} {what}; give a directory (it holds the run's checkpoints)")


_ABSENT = object()


def config_changes(saved: dict[str, Any], current: dict[str, Any], keys: Iterable[str] | None = None) -> list[str]:
    """The config keys (default: every leaf key of the schema; a list or a keyword dict is one
    value) whose values differ. A key the saved config lacks (written before the key existed) is
    not a change."""
    if keys is None:
        from armor_core.config.schema import help_for

        keys = [key for key, _, _ in help_for()]
    out = []
    for key in keys:
        before, now = _get(saved, key), _get(current, key)
        if before is not _ABSENT and before != now:
            out.append(key)
    return out


def _get(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(cfg, dict) or part not in cfg:
            return _ABSENT
        cfg = cfg[part]
    return cfg


def _covered(key: str, names: Iterable[str]) -> bool:
    return any(key == n or key.startswith(n + ".") for n in names)


def check_resume_config(
    run_dir: str | Path, current: dict[str, Any], allowed: Iterable[str] = (), by: str = "--resume"
) -> list[str]:
    """Compare ``current`` (the config as a dict) with ``<run_dir>/config.json``.

    :param allowed: keys (or whole sections, e.g. ``actor``) the user allows to change.
    :param by: what asked for the resume (``--resume`` or ``trainer.resume=auto``), as the error names it.
    :returns: lines describing the allowed changes, to print; ``RunDirError`` names the others.
    """
    path = Path(run_dir) / "config.json"
    try:
        saved = json.loads(path.read_text())
    except FileNotFoundError:
        return []  # nothing to resume from, or a run that never got as far as its first write
    except ValueError as e:
        raise RunDirError(
            f"{path} is not valid JSON ({e}); it records the config this run was started with. "
            "Restore it, or start a new run in another trainer.run_dir"
        ) from None
    allowed = [a.strip() for a in allowed if a.strip()]
    changed = config_changes(saved, current)
    refused = [k for k in changed if not _covered(k, ALWAYS_ALLOWED) and not _covered(k, allowed)]
    if refused:
        listing = ", ".join(f"{k} ({_value(saved, k)} -> {_value(current, k)})" for k in refused[:8])
        listing += f" and {len(refused) - 8} more" if len(refused) > 8 else ""
        raise RunDirError(
            f"{by} with a config that differs from the one {run_dir} was started with ({path}): {listing}. "
            f"Resume with the same config, or allow the change explicitly: --allow-config-change {','.join(refused)}"
        )
    return [
        f"{k}: {_value(saved, k)} -> {_value(current, k)}"
        for k in changed
        if _covered(k, allowed) and not _covered(k, ALWAYS_ALLOWED)
    ]


def _value(cfg: dict[str, Any], key: str) -> str:
    value = _get(cfg, key)
    return "(absent)" if value is _ABSENT else json.dumps(value)


class RunDirLock:
    """``with RunDirLock(run_dir):`` only one process at a time; ``RunDirError`` naming the holder's pid otherwise."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / ".lock"
        self._fd: int | None = None

    def __enter__(self) -> RunDirLock:
        import fcntl

        check_run_dir_path(self.path.parent)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # read-only, no permission, full disk: the run cannot keep anything there
            raise RunDirError(
                f"trainer.run_dir={self.path.parent}: cannot create {self.path} ({e.strerror or e}); "
                "choose a trainer.run_dir this user can write"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunDirError(
                f"{self.path.parent} is in use by another armor run (pid {holder}); "
                "two runs writing one directory would mix their checkpoints and metrics. "
                "Wait for it to end, or choose another trainer.run_dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None
