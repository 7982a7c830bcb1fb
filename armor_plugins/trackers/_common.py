"""What the ``wandb`` and ``mlflow`` trackers share: checking that their library is installed, the
config as plain data, the names a run is logged under, and whether it is ending in an error."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path
from typing import Any, Mapping

__all__ = ["config_dict", "ending_in_error", "require", "run_names"]


def require(module: str, extra: str) -> None:
    """Import ``module`` or raise an ImportError saying which ARMOR extra installs it."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"the {module} tracker needs the {module} package, which cannot be imported ({e}); "
            f"install it with: pip install 'armor-rl[{extra}]'"
        ) from None


def config_dict(config: Any) -> dict[str, Any]:
    """The run's config as nested plain dicts (``{}`` when there is none)."""
    if config is None:
        return {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if isinstance(config, Mapping):
        return dict(config)
    raise TypeError(f"a tracker's config must be the ArmorConfig or a dict, got {type(config).__name__}")


def run_names(run_dir: str | Path, config: Any) -> tuple[str, str]:
    """``(project, run name)`` from ``trainer.project_name`` and ``trainer.experiment_name``; the
    run name defaults to the run directory's name."""
    trainer = getattr(config, "trainer", None)
    project = getattr(trainer, "project_name", "") or "armor"
    name = getattr(trainer, "experiment_name", "") or Path(run_dir).resolve().name
    return project, name


def ending_in_error() -> bool:
    """True when called while an exception propagates: the trainer closes its trackers in a
    ``finally`` block, so a run that crashed can be marked as failed rather than finished."""
    return sys.exc_info()[0] is not None
