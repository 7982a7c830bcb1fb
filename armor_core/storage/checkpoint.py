"""Atomic, verified checkpoints of the whole run state.

Layout: ``<run_dir>/checkpoints/step_000010/`` holds ``model/`` (a Hugging Face directory that
``AutoModelForCausalLM.from_pretrained`` loads as is), the optimizer, scheduler and RNG states of
each worker, ``trainer_state.json`` (step, data position, guard and KL-controller state) and
``manifest.json`` (every other file's size and sha256).

A checkpoint is written into ``step_N.tmp``; its files and directories are fsynced and the
manifest written last, then it is renamed into place and the ``latest`` pointer is replaced
atomically. A crash at any point leaves the previous checkpoint usable and never a half-written
one that looks complete. A disk that fills up mid-save is reported as such, naming the directory.

On load every checkpoint is checked against its manifest (sizes first, then sha256; once per
checkpoint and process, while its files' sizes and mtimes stay the same). A damaged one (a
truncated or emptied file, a missing optimizer state, an edited ``trainer_state.json``) is
skipped with a warning naming the file, and the previous intact one is used; if checkpoints
exist but none is intact, ``CheckpointError`` says so. A checkpoint written before manifests
existed is accepted when its ``trainer_state.json`` reads correctly, with a warning that its
other files were not verified. ``check_intact`` makes the same check for ``armor export`` and
``armor eval`` of a checkpoint, and raises instead of falling back.
Every file is safetensors or JSON (worker states through
``armor_core/storage/state_io.py``); the ``.pt`` states of checkpoints written before that are read only when
the user opts in (``trainer.allow_legacy_pt_state=true``), with ``torch.load(weights_only=True)``: no arbitrary
pickle, and none at all by default.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from armor_core.errors import UserFacingError

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "CheckpointWarning",
    "DiskFullError",
    "MANIFEST",
    "check_intact",
    "checkpoint_of",
    "disk_full_error",
]

MANIFEST = "manifest.json"
STATE = "trainer_state.json"
# below this much space left after a failed write, the failure is taken to be a full disk: torch
# reports ENOSPC as "PytorchStreamWriter failed writing file ...", without the errno
_NEARLY_FULL_BYTES = 64 << 20


class CheckpointError(UserFacingError):
    """No intact checkpoint to resume from, or a checkpoint could not be written (disk full)."""


class DiskFullError(UserFacingError):
    """The disk filled while the run wrote its metrics or logs (``disk_full_error``)."""


class CheckpointWarning(UserWarning):
    """A damaged checkpoint was skipped, or an old one could not be verified."""


class CheckpointManager:
    """The checkpoints in ``<run_dir>/<folder>``: ``checkpoints`` is the run's (what ``--resume`` reads);
    ``rollback`` holds the rollback points on disk (``loop/rollback.py``), written and verified the same way."""

    def __init__(self, run_dir: str | Path, keep: int = 2, folder: str = "checkpoints") -> None:
        self.root = Path(run_dir) / folder
        self.keep = keep
        self._intact: dict[str, tuple] = {}  # checkpoint name -> the file signature it was verified with
        self._warned: set[tuple[str, str]] = set()

    def save(self, step: int, write: Callable[[Path], None], trainer_state: dict[str, Any]) -> Path:
        return self.finish(self.begin(step, write, trainer_state))

    def begin(self, step: int, write: Callable[[Path], None], trainer_state: dict[str, Any]) -> Path:
        """The first half of ``save``: ``write`` and the trainer state into ``step_N.tmp`` (returned); files written
        in the background may still be arriving, and the checkpoint is not one until ``finish``."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f"{self.name_of(step)}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        with self._cleaned(tmp):
            tmp.mkdir()
            write(tmp)
            (tmp / STATE).write_text(json.dumps(trainer_state, indent=1))
        return tmp

    def finish(self, tmp: Path, written: Callable[[], object] | None = None) -> Path:
        """The second half: once ``written()`` returns (the background writes are done) the manifest, then the
        rename into place and the ``latest`` pointer; a failure removes ``tmp`` and leaves the latest as it was."""
        final = tmp.with_name(tmp.name.removesuffix(".tmp"))
        with self._cleaned(tmp):
            if written is not None:
                written()
            _write_manifest(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        pointer_tmp = self.root / "latest.tmp"
        pointer_tmp.write_text(final.name)
        os.replace(pointer_tmp, self.root / "latest")
        _fsync_dir(self.root)
        if (signature := _signature(final)) is not None:  # just hashed: no need to read it back
            self._intact[final.name] = signature
        self._prune()
        return final

    @contextlib.contextmanager
    def _cleaned(self, tmp: Path) -> Iterator[None]:
        """Remove ``tmp`` when the body fails; a full disk becomes a ``CheckpointError`` saying so."""
        try:
            yield
        except BaseException as e:
            free = _free_bytes(self.root)  # before the partial files are removed
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, Exception) and _disk_full(e, free):
                name = tmp.name.removesuffix(".tmp")
                raise CheckpointError(self._disk_full_message(name, free, e)) from e
            raise

    def latest(self) -> Path | None:
        """The newest intact checkpoint, or None when there is none at all.

        Newer damaged ones are skipped with a ``CheckpointWarning`` naming the file; if checkpoints
        exist but none is intact, ``CheckpointError`` lists what is wrong with each.
        """
        damaged = {}
        for path in reversed(self._dirs()):  # newest first: the older ones are verified only if needed
            why = self.problem(path)
            if why is None:
                return path
            damaged[path.name] = why
            self._warn(path, f"checkpoint {path} is damaged and is skipped: {why}")
        if damaged:
            listing = "; ".join(f"{name}: {why}" for name, why in damaged.items())
            raise CheckpointError(
                f"no intact checkpoint in {self.root} ({listing}). Move the damaged ones away to start "
                "from step 0, or choose another trainer.run_dir."
            )
        return None

    @staticmethod
    def name_of(step: int) -> str:
        return f"step_{step:06d}"

    def completed(self) -> list[Path]:
        """Intact checkpoints, oldest first; a damaged one is left out with a warning."""
        out = []
        for path in self._dirs():
            why = self.problem(path)
            if why is None:
                out.append(path)
            else:
                self._warn(path, f"checkpoint {path} is damaged and is skipped: {why}")
        return out

    def before(self, step: int) -> Path | None:
        """The newest intact checkpoint of a step < ``step``."""
        older = [p for p in self.completed() if _step_of(p) < step]
        return older[-1] if older else None

    def remove_after(self, step: int) -> None:
        """Remove the checkpoints of steps after ``step``, intact or not (a rollback discarded what they hold)."""
        for path in self._dirs():
            if _step_of(path) > step:
                shutil.rmtree(path, ignore_errors=True)
                self._intact.pop(path.name, None)

    @staticmethod
    def step_of(path: Path) -> int:
        """The step a checkpoint directory is named after."""
        return _step_of(path)

    @staticmethod
    def trainer_state(path: Path) -> dict[str, Any]:
        return json.loads((path / STATE).read_text())

    def problem(self, path: Path, deep: bool = True) -> str | None:
        """What is wrong with the checkpoint at ``path``, naming the file; None if it is intact.

        ``deep=False`` checks that every file is there with its size, without hashing.
        """
        if not (path / MANIFEST).exists():
            if not (path / STATE).exists():
                return f"{STATE} is missing"
            why = _state_problem(path)
            if why is None:
                self._warn(
                    path, f"checkpoint {path} has no {MANIFEST} (written by an older ARMOR): its files are not verified"
                )
            return why
        try:
            files = json.loads((path / MANIFEST).read_text())["files"]
            sizes = {rel: int(entry["size"]) for rel, entry in files.items()}
            digests = {rel: str(entry["sha256"]) for rel, entry in files.items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return f"{MANIFEST} cannot be read ({type(e).__name__}: {e})"
        if STATE not in sizes:
            return f"{MANIFEST} does not list {STATE}"
        sig = _signature(path, sizes)
        if sig is not None and self._intact.get(path.name) == sig:
            return None
        for rel, size in sizes.items():  # every size before any hash: a truncated file is found at once
            f = path / rel
            if not f.is_file():
                return f"{rel} is missing"
            if f.stat().st_size != size:
                return f"{rel} has {f.stat().st_size} bytes where {size} were written (truncated or replaced)"
        if not deep:
            return _state_problem(path)
        for rel, digest in digests.items():
            if _sha256(path / rel) != digest:
                return f"{rel} does not match the sha256 written with it (corrupted or edited)"
        why = _state_problem(path)
        if why is None and sig is not None:
            self._intact[path.name] = sig
        return why

    def _dirs(self) -> list[Path]:
        """Every checkpoint directory renamed into place, oldest first, intact or not."""
        if not self.root.is_dir():
            return []
        return sorted(
            (p for p in self.root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp") and _step_of(p) >= 0),
            key=_step_of,
        )

    def _warn(self, path: Path, message: str) -> None:
        if (path.name, message) not in self._warned:  # latest() is asked often: say it once
            self._warned.add((path.name, message))
            warnings.warn(message, CheckpointWarning, stacklevel=3)

    def _prune(self) -> None:
        """Keep the newest ``keep`` intact checkpoints and drop everything older than them.

        A damaged checkpoint newer than those is left for the user to look at; it is skipped on
        load, and replaced when the run saves that step again.
        """
        intact = [p for p in self._dirs() if self.problem(p, deep=False) is None]  # no hashing on every save
        if len(intact) <= self.keep:
            return
        oldest_kept = _step_of(intact[-self.keep]) if self.keep > 0 else float("inf")
        for old in self._dirs():
            if _step_of(old) < oldest_kept:
                shutil.rmtree(old, ignore_errors=True)
                self._intact.pop(old.name, None)

    def _disk_full_message(self, name: str, free: int | None, e: BaseException) -> str:
        kept = [p.name for p in self._dirs() if p.name != name]
        previous = f"the previous checkpoint, {kept[-1]}, is left as it was" if kept else "no earlier checkpoint exists"
        what = f"checkpoint {name} could not be written and its partial files were removed; {previous}"
        return _full_message(self.root, what, free, e)


def _full_message(where: Path, what: str, free: int | None, e: BaseException) -> str:
    left = f" ({free / 2**20:.0f} MiB left)" if free is not None else ""
    return (
        f"the disk holding {where} is full{left}: {what}. "
        "Free space there (or lower trainer.keep_checkpoints) and run again with --resume. "
        f"[{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}]"
    )


def disk_full_error(e: BaseException, where: Path, what: str) -> DiskFullError | None:
    """``e`` as the one-line error a full disk gets (worded as at checkpoint time), or None when it is
    not a full disk. ``what``: what could not be written, and what was left."""
    free = _free_bytes(where)
    return DiskFullError(_full_message(where, what, free, e)) if _disk_full(e, free) else None


def checkpoint_of(path: str | Path) -> Path | None:
    """The run checkpoint whose ``model/`` or ``adapter/`` directory ``path`` is, or None. (Only those
    two names: a Hugging Face Trainer's ``checkpoint-N/`` holds a ``trainer_state.json`` of its own.)"""
    p = Path(path)
    if p.name in ("model", "adapter") and ((p.parent / MANIFEST).is_file() or (p.parent / STATE).is_file()):
        return p.parent
    return None


def check_intact(checkpoint: Path) -> None:
    """The check ``--resume`` makes, for a command about to use one checkpoint's weights (``armor export``,
    ``armor eval``): every file against the manifest's sizes and sha256.

    A directory with neither ``manifest.json`` nor ``trainer_state.json`` (a worker's own
    ``save_checkpoint``, not a run's) has nothing to check against: a ``CheckpointWarning`` says so.

    :raises CheckpointError: naming the checkpoint and the damaged file.
    """
    if not (checkpoint / MANIFEST).is_file() and not (checkpoint / STATE).is_file():
        warnings.warn(f"{checkpoint} has no {MANIFEST}: its files are not verified", CheckpointWarning, stacklevel=2)
        return
    why = CheckpointManager(checkpoint.parent).problem(checkpoint)
    if why is not None:
        raise CheckpointError(
            f"checkpoint {checkpoint} is damaged: {why}; its weights are not used. Take an earlier checkpoint of the "
            "run (ls its checkpoints/)"
        )


def _step_of(path: Path) -> int:
    try:
        return int(path.name.split("_", 1)[1])
    except (IndexError, ValueError):
        return -1


def _state_problem(path: Path) -> str | None:
    try:
        state = json.loads((path / STATE).read_text())
    except (OSError, ValueError) as e:
        return f"{STATE} is not valid JSON ({type(e).__name__}: {e})"
    if not isinstance(state, dict) or not isinstance(state.get("step"), int) or state["step"] < 0:
        return f"{STATE} has no step number (expected an object with an integer 'step')"
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _signature(path: Path, sizes: dict[str, int] | None = None) -> tuple | None:
    """Sizes and mtimes of a checkpoint's files: if they have not changed, neither has the verdict."""
    if sizes is None:
        try:
            sizes = {rel: 0 for rel in json.loads((path / MANIFEST).read_text())["files"]}
        except (OSError, ValueError, KeyError):
            return None
    try:
        return tuple(
            (rel, (path / rel).stat().st_size, (path / rel).stat().st_mtime_ns) for rel in sorted(sizes) + [MANIFEST]
        )
    except OSError:
        return None


def _write_manifest(folder: Path) -> None:
    """Hash and fsync every file under ``folder``, write ``manifest.json``, fsync every directory."""
    files: dict[str, dict[str, Any]] = {}
    dirs = [folder]
    for f in sorted(folder.rglob("*")):
        if f.is_dir():
            dirs.append(f)
            continue
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
            os.fsync(fh.fileno())  # the data on disk before the rename makes it look complete
        files[f.relative_to(folder).as_posix()] = {"size": f.stat().st_size, "sha256": h.hexdigest()}
    with open(folder / MANIFEST, "w") as fh:
        json.dump({"format": 1, "files": files}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        _fsync_dir(d)


def _free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _disk_full(e: BaseException, free: int | None) -> bool:
    """Whether ``e`` (or what caused it, also when raised in a worker) is a full disk or quota."""
    seen: set[int] = set()
    x: BaseException | None = e
    while x is not None and id(x) not in seen:
        seen.add(id(x))
        if isinstance(x, OSError) and x.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(x) or "Disk quota exceeded" in str(x):
            return True
        x = x.__cause__ or x.__context__
    return free is not None and free < _NEARLY_FULL_BYTES


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
