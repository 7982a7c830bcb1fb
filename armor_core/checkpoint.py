"""Atomic checkpoints of the whole run state.

Layout: ``<run_dir>/checkpoints/step_000010/`` holds ``model/`` (a Hugging Face directory that
``AutoModelForCausalLM.from_pretrained`` loads as is), the optimizer, scheduler and RNG states of
each worker, and ``trainer_state.json`` (step, data position, guard and KL-controller state).

A checkpoint is written into ``step_N.tmp`` and renamed into place only when complete, then the
``latest`` pointer is replaced atomically; a crash at any point leaves the previous checkpoint
usable and never a half-written one that looks complete. Loading uses safetensors and
``torch.load(weights_only=True)``: no arbitrary pickle.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

__all__ = ["CheckpointManager"]


class CheckpointManager:
    def __init__(self, run_dir: str | Path, keep: int = 2) -> None:
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep

    def save(self, step: int, write: Callable[[Path], None], trainer_state: dict[str, Any]) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / self.name_of(step)
        tmp = self.root / f"{self.name_of(step)}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        write(tmp)
        (tmp / "trainer_state.json").write_text(json.dumps(trainer_state, indent=1))
        _fsync_dir(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        pointer_tmp = self.root / "latest.tmp"
        pointer_tmp.write_text(final.name)
        os.replace(pointer_tmp, self.root / "latest")
        _fsync_dir(self.root)
        self._prune()
        return final

    def latest(self) -> Path | None:
        pointer = self.root / "latest"
        if pointer.exists():
            path = self.root / pointer.read_text().strip()
            if (path / "trainer_state.json").exists():
                return path
        done = self.completed()
        return done[-1] if done else None

    @staticmethod
    def name_of(step: int) -> str:
        return f"step_{step:06d}"

    def completed(self) -> list[Path]:
        """Finished checkpoints, oldest first."""
        return sorted(p for p in self.root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp") and (p / "trainer_state.json").exists())

    def before(self, step: int) -> Path | None:
        """The newest finished checkpoint of a step < ``step``."""
        older = [p for p in self.completed() if int(p.name.split("_")[1]) < step]
        return older[-1] if older else None

    @staticmethod
    def trainer_state(path: Path) -> dict[str, Any]:
        return json.loads((path / "trainer_state.json").read_text())

    def _prune(self) -> None:
        done = sorted(p for p in self.root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))
        for old in done[: max(0, len(done) - self.keep)]:
            shutil.rmtree(old, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
