"""Ways a checkpoint gets damaged on disk, each of which ``--resume`` must survive by falling back to
the previous checkpoint with a warning naming the file. Shared by ``tests/core/test_checkpoint.py``
and ``benchmarks/faults.py``, so the test and the reliability table try the same damage.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

__all__ = ["CHECKPOINT_DAMAGE", "flip_byte"]


def flip_byte(f: Path) -> None:
    """Invert the middle byte of ``f``: same size, so only the checksum can tell."""
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))


def _unlink_manifest_and_empty(f: Path) -> None:
    f.write_text("{}")
    (f.parent / "manifest.json").unlink()


# name -> (the file inside the checkpoint directory, what is done to it)
CHECKPOINT_DAMAGE: dict[str, tuple[str, Callable[[Path], object]]] = {
    "truncated weights": ("model/model.safetensors", lambda f: f.write_bytes(f.read_bytes()[:1000])),
    "empty weights": ("model/model.safetensors", lambda f: f.write_bytes(b"")),
    "one flipped byte in the weights": ("model/model.safetensors", flip_byte),
    "missing optimizer state": ("actor_state.safetensors", lambda f: f.unlink()),
    "truncated optimizer state": ("actor_state.safetensors", lambda f: f.write_bytes(f.read_bytes()[:10])),
    "garbage trainer_state.json": ("trainer_state.json", lambda f: f.write_bytes(b"\x00garbage")),
    "trainer_state.json holding {}": ("trainer_state.json", lambda f: f.write_text("{}")),
    "deleted trainer_state.json": ("trainer_state.json", lambda f: f.unlink()),
    # without the manifest the sizes and checksums are unknown: the content itself must be checked
    "deleted manifest, trainer_state.json holding {}": ("trainer_state.json", _unlink_manifest_and_empty),
}
