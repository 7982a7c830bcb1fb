"""Ways a checkpoint gets damaged on disk, each of which ``--resume`` must survive by falling back to
the previous checkpoint with a warning naming the file; a run checkpoint damaged after it was written
(``flipped_checkpoint``), which ``armor export`` and ``armor eval`` must refuse; and a model directory
that carries Python code of its own (``add_own_code``), which ARMOR must not run unless told to.
Shared by the tests and ``benchmarks/faults.py``, so the test and the reliability table try the same thing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

__all__ = ["CHECKPOINT_DAMAGE", "add_own_code", "flipped_checkpoint", "flip_byte", "write_adapter"]


def flip_byte(f: Path) -> None:
    """Invert the middle byte of ``f``: same size, so only the checksum can tell."""
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))


def write_adapter(directory: Path) -> Path:
    """A rank-2 LoRA adapter of ``builtin:arithmetic-tiny`` in peft's format, with the tokenizer, as a LoRA
    run's checkpoint holds it (``base_model_name_or_path`` is the built-in model's directory)."""
    from armor_core.models.loading import load_model, load_tokenizer
    from armor_core.models.lora import apply_lora, save_adapter

    save_adapter(apply_lora(load_model("builtin:arithmetic-tiny"), 2, 4.0, 0.0, "all-linear", 0), directory)
    load_tokenizer("builtin:arithmetic-tiny").save_pretrained(directory)
    return directory


def flipped_checkpoint(run_dir: Path, *, lora: bool = False) -> Path:
    """A run checkpoint (manifest written) of the built-in model, or of an adapter of it, whose weights then
    had one byte flipped: same size and header, so only the manifest's sha256 tells."""
    import shutil

    from armor_core.models.loading import resolve_model_path
    from armor_core.storage.checkpoint import CheckpointManager

    def write(d: Path) -> None:
        if lora:
            write_adapter(d / "adapter")
        else:
            shutil.copytree(resolve_model_path("builtin:arithmetic-tiny"), d / "model")

    checkpoint = CheckpointManager(run_dir).save(1, write, {"step": 1})
    flip_byte(checkpoint / ("adapter/adapter_model.safetensors" if lora else "model/model.safetensors"))
    return checkpoint


def add_own_code(directory: Path, *, native: bool = False) -> Path:
    """Give the Qwen2 model directory ``directory`` modelling code of its own, named by ``config.json``'s
    ``auto_map`` as a hub repository with custom code does; returns the file that code writes when it runs.

    :param native: keep ``model_type`` ``qwen2`` (transformers' own class can load it, as DeepSeek-V3
        checkpoints that also carry code); otherwise ``armor_probe``, which only the directory's code knows.
    """
    import json

    marker = directory / "its_code_ran"
    (directory / "configuration_probe.py").write_text(
        "from pathlib import Path\n\nfrom transformers import Qwen2Config\n\n"
        f"Path({str(marker)!r}).write_text('the model directory\\'s code ran')\n\n\n"
        "class ProbeConfig(Qwen2Config):\n    model_type = 'armor_probe'\n"
    )
    (directory / "modeling_probe.py").write_text(
        "from transformers import Qwen2ForCausalLM\n\nfrom .configuration_probe import ProbeConfig\n\n\n"
        "class ProbeForCausalLM(Qwen2ForCausalLM):\n    config_class = ProbeConfig\n"
    )
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = "qwen2" if native else "armor_probe"
    config["auto_map"] = {
        "AutoConfig": "configuration_probe.ProbeConfig",
        "AutoModelForCausalLM": "modeling_probe.ProbeForCausalLM",
    }
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return marker


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
