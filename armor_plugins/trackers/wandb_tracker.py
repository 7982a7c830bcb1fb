"""``wandb``: metrics to Weights & Biases (``pip install 'armor-rl[wandb]'``).

The config is the run's wandb config, each step's metrics one history row at ARMOR's step, and
the trainer's summary (``summary.json``) goes into the run summary at the end. Files go under
``<run_dir>/wandb``. With no credentials configured the run is offline, so it never waits on the
network: ``wandb sync <run_dir>/wandb/offline-run-*`` uploads it later. ``WANDB_MODE`` set in the
environment is obeyed as is; ``WANDB_ENTITY`` and the other ``WANDB_*`` variables apply as usual.

A ``--resume`` is a new wandb run in the same group (the run name): steps after the checkpoint are
trained and logged again, and wandb accepts steps in increasing order only within one run. The
config records ``resumed_from_step``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Mapping

from armor_plugins.trackers._common import config_dict, ending_in_error, require, run_names

__all__ = ["WandbTracker", "has_credentials", "wandb_mode"]


def has_credentials() -> bool:
    """Whether wandb would find credentials without asking: ``WANDB_API_KEY``,
    ``WANDB_IDENTITY_TOKEN_FILE``, ``api_key`` in wandb's settings files, or a ``.netrc`` entry
    for the W&B host (what ``wandb login`` writes). Nothing is sent over the network."""
    import wandb
    from wandb.sdk.lib import wbauth

    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    settings = wandb.setup().settings
    return bool(settings.api_key or wbauth.read_netrc_auth(host=settings.base_url))


def wandb_mode() -> Literal["online", "offline"] | None:
    """``None`` (wandb reads ``WANDB_MODE``) when the user chose a mode, else online with
    credentials and offline without."""
    if os.environ.get("WANDB_MODE"):
        return None
    return "online" if has_credentials() else "offline"


class WandbTracker:
    """One wandb run per ``armor run`` session, created at start and finished at the end."""

    @classmethod
    def check_available(cls) -> None:
        require("wandb", "wandb")

    def __init__(self, run_dir: str | Path, config: Any = None) -> None:
        self.check_available()
        import wandb

        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        project, name = run_names(run_dir, config)
        # create_new: this run is ours alone; wandb.run and other runs in the process are untouched
        self.run = wandb.init(
            project=project,
            name=name,
            group=name,
            dir=str(run_dir),
            mode=wandb_mode(),
            config=config_dict(config),
            reinit="create_new",
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def resume(self, step: int) -> None:
        self.run.config.update({"resumed_from_step": step}, allow_val_change=True)

    def summary(self, summary: Mapping[str, Any]) -> None:
        self.run.summary.update(dict(summary))

    def close(self) -> None:
        self.run.finish(exit_code=1 if ending_in_error() else 0)
