"""What ``--resume`` settles on the driver before any worker starts or any file is written.

- ``resumed_by``: whether a run continues from its run directory, and who asked: ``--resume``, or
  ``trainer.resume=auto`` (the same resume, and a start at step 0 where no checkpoint is intact: a job
  restarted with its own command after preemption goes on where it stopped).
- ``has_checkpoint``: whether the run directory holds an intact checkpoint (``trainer.resume=auto``
  checks the config against the run's ``config.json`` only then).
- ``nothing_left``: the run's latest intact checkpoint is already at its end (``trainer.total_steps``
  or ``trainer.total_epochs``): ``run_training`` says so and returns, writing nothing (no final
  validation row, no rewritten ``config.json``, no tracker files).
- ``check_lora_base``: a LoRA checkpoint's adapter is resumed only on the base model it was trained
  on (``models/lora.py``'s base manifest), checked here rather than in the workers some 20 s later.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from armor_core.config.schema import ArmorConfig

__all__ = ["check_lora_base", "has_checkpoint", "nothing_left", "resumed_by"]


def resumed_by(cfg: ArmorConfig, flag: bool) -> str | None:
    """``"--resume"`` when the flag was given, ``"trainer.resume=auto"`` when the config asks, else None (a new run)."""
    if flag:
        return "--resume"
    return "trainer.resume=auto" if cfg.trainer.resume == "auto" else None


def has_checkpoint(cfg: ArmorConfig) -> bool:
    """``trainer.run_dir`` holds an intact checkpoint (damaged newer ones are warned about later, by the trainer;
    ``CheckpointError`` when every one is damaged, as a resume would raise)."""
    return _latest(cfg)[0] is not None


def nothing_left(cfg: ArmorConfig, by: str = "--resume") -> str | None:
    """The message for a resume whose latest checkpoint already ends the run, else None.

    Mirrors the condition of ``Trainer.fit``'s loop: it trains while ``step < total_steps`` and
    (when set) ``epoch < total_epochs``.
    """
    from armor_core.storage.checkpoint import CheckpointManager

    latest, skipped = _latest(cfg)
    if latest is None:
        return None
    state = CheckpointManager.trainer_state(latest)
    step, epoch, t = int(state["step"]), int(state.get("loader", {}).get("epoch", 0)), cfg.trainer
    if step >= t.total_steps:
        key = f"trainer.total_steps={t.total_steps}"
    elif t.total_epochs is not None and epoch >= t.total_epochs:
        key = f"trainer.total_epochs={t.total_epochs}"
    else:
        return None  # the trainer looks for the checkpoint again, and warns about the damaged ones it skips
    for w in skipped:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return (
        f"{by}: the latest checkpoint, {latest}, is at step {step}, and {key} ends the run there; nothing to "
        f"train and nothing was written. Raise {key.split('=')[0]} to train further"
    )


def check_lora_base(cfg: ArmorConfig) -> None:
    """The latest checkpoint's LoRA adapter (if any) was trained on ``model.path``.

    :raises ModelPathError: naming the checkpoint, the base file that differs, and what to do.
    """
    from armor_core.models.loading import ModelPathError, resolve_model_path
    from armor_core.models.lora import ADAPTER_DIR, base_problem

    latest, _ = _latest(cfg)
    if latest is None or not (latest / ADAPTER_DIR).is_dir():
        return
    base = resolve_model_path(cfg.model.path, need_tokenizer=False)
    why = base_problem(Path(latest) / ADAPTER_DIR, base)
    if why is not None:
        raise ModelPathError(
            f"checkpoint {latest} holds a LoRA adapter trained on another base model than model.path={cfg.model.path}: "
            f"{why}. An adapter is only valid on its own base: restore that model, or start a new run"
        )


def _latest(cfg: ArmorConfig) -> tuple[Path | None, list[warnings.WarningMessage]]:
    """The latest intact checkpoint, and the warnings about damaged newer ones, not shown: the
    trainer's own look for it shows them, once."""
    from armor_core.storage.checkpoint import CheckpointManager

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        latest = CheckpointManager(cfg.trainer.run_dir).latest()
    return latest, seen
