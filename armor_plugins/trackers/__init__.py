"""Built-in metric trackers: ``jsonl`` (metrics.jsonl in the run directory), ``tensorboard``, ``console``,
and, behind optional extras, ``wandb`` (``wandb_tracker.py``) and ``mlflow`` (``mlflow_tracker.py``).

On ``--resume`` from the checkpoint of step N the steps after N are trained (and logged) again:
``resume(N)`` drops what ``jsonl`` holds for them, and tells TensorBoard to hide what it has
(``resume(-1)``: a resume that found no checkpoint starts over, step 0's validation included).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping

from armor_core import hookimpl
from armor_core.hookspecs import RegisterMetricTracker
from armor_plugins.trackers.mlflow_tracker import MlflowTracker
from armor_plugins.trackers.wandb_tracker import WandbTracker


class JsonlTracker:
    """One JSON object per step in ``<run_dir>/metrics.jsonl``; non-finite values are written as strings.

    A row is whole or absent: it goes out in unbuffered writes, and a write that fails part-way (a
    full disk) is cut back to the last whole row before the error goes on to the trainer.
    """

    def __init__(self, run_dir: str | Path, config: Any = None) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        row: dict[str, float | str] = {"step": step}
        for k, v in metrics.items():
            v = float(v)
            row[k] = v if math.isfinite(v) else str(v)
        data = (json.dumps(row) + "\n").encode()
        end = os.fstat(self._fd).st_size
        try:
            done = 0
            while done < len(data):  # a write may take fewer bytes than asked (e.g. the last ones the disk had)
                done += os.write(self._fd, data[done:])
        except BaseException:
            os.ftruncate(self._fd, end)
            raise

    def resume(self, step: int) -> None:
        """Keep the rows of steps up to ``step`` only: the resumed run logs the later ones again.
        A line that does not parse (the half-written last row of a killed run) goes too."""
        os.close(self._fd)
        kept = []
        with open(self.path, "rb") as fh:
            for line in fh:
                try:
                    row_step = json.loads(line)["step"]
                except (ValueError, TypeError, KeyError):
                    continue
                if isinstance(row_step, int) and row_step <= step:
                    kept.append(line if line.endswith(b"\n") else line + b"\n")
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_bytes(b"".join(kept))
        os.replace(tmp, self.path)  # a crash here leaves the old file or the new one, never half of one
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class TensorBoardTracker:
    """Scalars under ``<run_dir>/tensorboard``: one event per step holding all its scalars,
    written in the caller's thread and flushed every ``FLUSH_S`` seconds and on close.

    torch's ``SummaryWriter.add_scalar`` queues an event per scalar into a 10-slot queue for a
    writer thread, and a flush waits for it: a step's ~60 metrics held the driver ~4.5 ms. One
    event written here costs ~0.5 ms, and no thread competes with the driver for the GIL or with
    the workers for the cores (a background writer cost the driver ~0.5 ms a step more, measured).
    """

    FLUSH_S = 5.0
    _opened = itertools.count()  # trackers opened in one process within a second get files of their own

    def __init__(self, run_dir: str | Path, config: Any = None) -> None:
        import os
        import socket

        from tensorboard.compat.proto.event_pb2 import Event  # pyright: ignore[reportAttributeAccessIssue]  (generated protobuf, no stubs)
        from tensorboard.summary.writer.record_writer import RecordWriter

        folder = Path(run_dir) / "tensorboard"
        folder.mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(self._opened)}"
        self._records = RecordWriter(open(folder / name, "wb"))
        self._records.write(Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        self._flush()

    def _flush(self) -> None:
        self._records.flush()
        self._flushed = time.monotonic()

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event  # pyright: ignore[reportAttributeAccessIssue]  (generated protobuf, no stubs)
        from tensorboard.compat.proto.summary_pb2 import Summary  # pyright: ignore[reportAttributeAccessIssue]  (generated protobuf, no stubs)

        values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in metrics.items()]
        self._records.write(Event(wall_time=time.time(), step=step, summary=Summary(value=values)).SerializeToString())
        if time.monotonic() - self._flushed >= self.FLUSH_S:
            self._flush()

    def resume(self, step: int) -> None:
        """A session restart at ``step + 1``: TensorBoard discards the events of that step and later
        that earlier files hold (what ``SummaryWriter(purge_step=...)`` writes)."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog  # pyright: ignore[reportAttributeAccessIssue]  (generated protobuf, no stubs)

        self._records.write(
            Event(
                wall_time=time.time(), step=step + 1, session_log=SessionLog(status=SessionLog.START)
            ).SerializeToString()
        )
        self._flush()

    def close(self) -> None:
        if not self._records.closed:
            self._flush()
            self._records.close()


class ConsoleTracker:
    """A live progress line with the key numbers (rich), one line per step when not on a terminal."""

    KEYS = (
        ("critic/score/mean", "score"),
        ("val/acc_greedy", "val"),
        ("actor/pg_loss", "pg_loss"),
        ("actor/ppo_kl", "kl"),
        ("actor/entropy", "ent"),
        ("actor/grad_norm", "gnorm"),
        ("timing_s/step", "s/step"),
    )

    def __init__(self, run_dir: str | Path, config: Any = None) -> None:
        from rich.console import Console

        self.console = Console(highlight=False, soft_wrap=True)
        self.total = getattr(getattr(config, "trainer", None), "total_steps", None)
        self._progress = None
        if self.console.is_terminal and self.total:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]armor"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.description}"),
                console=self.console,
            )
            self._task = self._progress.add_task("", total=self.total)
            self._progress.start()

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        parts = [f"{short} {float(metrics[k]):.4g}" for k, short in self.KEYS if k in metrics]
        line = "  ".join(parts)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, description=line)
        else:
            total = f"/{self.total}" if self.total else ""
            # written as is: rich's print would parse markup in it, and costs ~0.5 ms a line
            self.console.file.write(f"step {step}{total}  {line}\n")
            self.console.file.flush()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


@hookimpl
def armor_register_metric_trackers(register: RegisterMetricTracker) -> None:
    register("jsonl", JsonlTracker)
    register("tensorboard", TensorBoardTracker)
    register("console", ConsoleTracker)
    register("wandb", WandbTracker)
    register("mlflow", MlflowTracker)
