"""``mlflow``: metrics to MLflow (``pip install 'armor-rl[mlflow]'``, which installs ``mlflow-skinny``).

Where: ``trainer.mlflow_tracking_uri`` if set, else ``MLFLOW_TRACKING_URI``, else a file store in
``<run_dir>/mlruns`` (browse it with ``mlflow ui --backend-store-uri <run_dir>/mlruns``, which needs
the full ``mlflow`` package). The experiment is ``trainer.project_name``, the run name
``trainer.experiment_name`` or the run directory's name. The config is logged as parameters
(flattened: ``actor.lr``; a list as one JSON value), each step's metrics at ARMOR's step, and the
trainer's summary as the artifact ``summary.json``. A run that crashed is marked FAILED.

MLflow accepts metric names of letters, digits and ``_ - . / : `` and space only; any other
character becomes ``_`` (``val/mean@4`` is logged as ``val/mean_4``).

A ``--resume`` is a new MLflow run with the same name, tagged ``armor.resumed_from_step``: MLflow
keeps every value logged at a step, so steps trained again would otherwise hold two values.
"""

from __future__ import annotations

import json
import os
import re
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Mapping
from urllib.parse import urlparse

from armor_plugins.trackers._common import config_dict, ending_in_error, require, run_names

__all__ = ["MlflowTracker", "flat_params", "mlflow_name"]

_NOT_ALLOWED = re.compile(r"[^/\w.\- :]")
_PARAMS_PER_BATCH, _METRICS_PER_BATCH = 100, 1000  # MLflow's log_batch limits
# a file store appends to one file per metric, tens a step: slow enough to show in timing_s/log when
# done in the driver's thread. One writer thread of our own logs while the driver waits on the
# workers: MLflow's own asynchronous logging writes batches from several threads at once, and its
# file store then races to create a new metric's directory ("[Errno 17] File exists"). Waiting once
# every _MAX_PENDING batches bounds what is held in memory and raises a write error within that many
# steps; every other call waits for the writer first, so the store sees one writer at a time.
_MAX_PENDING = 32


def mlflow_name(key: str) -> str:
    """``key`` with the characters MLflow refuses in a metric name replaced by ``_``."""
    return _NOT_ALLOWED.sub("_", key)


def flat_params(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """``(dotted key, JSON text)`` for every leaf of the config (``actor.lr``,
    ``data.task_kwargs.digits``); a list or an empty dict is one value, a string is written as is."""
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            yield from flat_params(value, f"{prefix}{key}.")
        else:
            yield mlflow_name(f"{prefix}{key}"), value if isinstance(value, str) else json.dumps(value)


def _chunks(items: list, size: int) -> Iterator[list]:
    return (items[i : i + size] for i in range(0, len(items), size))


class MlflowTracker:
    """One MLflow run per ``armor run`` session, through ``MlflowClient`` (no global active run)."""

    @classmethod
    def check_available(cls) -> None:
        require("mlflow", "mlflow")

    def __init__(self, run_dir: str | Path, config: Any = None) -> None:
        self.check_available()
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        run_dir = Path(run_dir)
        trainer = getattr(config, "trainer", None)
        uri = (
            getattr(trainer, "mlflow_tracking_uri", "")
            or os.environ.get("MLFLOW_TRACKING_URI")
            or (run_dir / "mlruns").resolve().as_uri()
        )
        if urlparse(uri).scheme in ("", "file"):
            # MLflow 3 refuses a file store unless this is set (it recommends a database); a file
            # store in the run directory needs no server and no database package
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        project, name = run_names(run_dir, config)
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(project)
        self._pending: list[Future] = []
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="armor-mlflow")
        self.run_id = self.client.create_run(
            experiment_id, run_name=name, tags={"armor.run_dir": str(run_dir.resolve())}
        ).info.run_id
        params = [Param(k, v) for k, v in flat_params(config_dict(config))]
        for batch in _chunks(params, _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=batch)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(mlflow_name(k), float(v), now, step) for k, v in metrics.items()]
        for batch in _chunks(rows, _METRICS_PER_BATCH):
            self._pending.append(self._writer.submit(self.client.log_batch, self.run_id, metrics=batch))
        if len(self._pending) >= _MAX_PENDING:
            self._wait()

    def _wait(self) -> None:
        pending, self._pending = self._pending, []
        for operation in pending:
            operation.result()  # a write error is raised here, in the driver

    def resume(self, step: int) -> None:
        self._wait()
        self.client.set_tag(self.run_id, "armor.resumed_from_step", str(step))

    def summary(self, summary: Mapping[str, Any]) -> None:
        self._wait()
        self.client.log_dict(self.run_id, dict(summary), "summary.json")

    def close(self) -> None:
        try:
            self._wait()
        finally:  # a write error, or the run's own, marks it failed
            self._writer.shutdown(wait=True)
            self.client.set_terminated(self.run_id, "FAILED" if ending_in_error() else "FINISHED")
