"""Built-in metric trackers: ``jsonl`` (metrics.jsonl in the run directory), ``tensorboard``, ``console``."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping

from armor_core import hookimpl


class JsonlTracker:
    """One JSON object per step in ``<run_dir>/metrics.jsonl``; non-finite values are written as strings."""

    def __init__(self, run_dir: str | Path, config: Any = None) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        row = {"step": step}
        for k, v in metrics.items():
            v = float(v)
            row[k] = v if math.isfinite(v) else str(v)
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class TensorBoardTracker:
    """Scalars under ``<run_dir>/tensorboard``."""

    def __init__(self, run_dir: str | Path, config: Any = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / "tensorboard"))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, float(v), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class ConsoleTracker:
    """A live progress line with the key numbers (rich), one line per step when not on a terminal."""

    KEYS = (("critic/score/mean", "score"), ("val/acc_greedy", "val"), ("actor/pg_loss", "pg_loss"),
            ("actor/ppo_kl", "kl"), ("actor/entropy", "ent"), ("actor/grad_norm", "gnorm"), ("timing_s/step", "s/step"))

    def __init__(self, run_dir: str | Path, config: Any = None) -> None:
        from rich.console import Console

        self.console = Console(highlight=False, soft_wrap=True)
        self.total = getattr(getattr(config, "trainer", None), "total_steps", None)
        self._progress = None
        if self.console.is_terminal and self.total:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn("[bold]armor"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), TextColumn("{task.description}"), console=self.console)
            self._task = self._progress.add_task("", total=self.total)
            self._progress.start()

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        parts = [f"{short} {float(metrics[k]):.4g}" for k, short in self.KEYS if k in metrics]
        line = "  ".join(parts)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, description=line)
        else:
            total = f"/{self.total}" if self.total else ""
            self.console.print(f"step {step}{total}  {line}")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


@hookimpl
def armor_register_metric_trackers(register):
    register("jsonl", JsonlTracker)
    register("tensorboard", TensorBoardTracker)
    register("console", ConsoleTracker)
