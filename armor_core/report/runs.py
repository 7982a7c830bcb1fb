"""Reading run directories for ``armor report``: as much of ``metrics.jsonl`` as parses, the guard's
events, the config and whether the run finished.

A run that is still going, or one that crashed, may end ``metrics.jsonl`` with half a line; that line
is left out and said so in the run's notes, never an error. Several rows may carry the same step (a
validation is logged as a row of its own): their metrics are merged, the later row winning.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from armor_core.errors import UserFacingError

__all__ = ["GRAD_NORM_AFTER_CLIP", "ReportError", "Run", "load_runs"]

#: derived series: the actor's gradient norm after clipping, min(actor/grad_norm, actor.grad_clip)
GRAD_NORM_AFTER_CLIP = "actor/grad_norm_after_clip"

_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class ReportError(UserFacingError):
    """A path given to ``armor report`` is not a run directory, or the labels do not match the runs."""


@dataclass
class Run:
    """One run directory as the report sees it.

    ``metrics`` maps a metric key to ``{step: value}`` (non-finite values kept as float NaN/inf);
    ``events`` are the guard's decisions from ``guard_events.jsonl``, each once (runs written before
    only rank 0 recorded worker-side verdicts hold one copy per data-parallel rank); ``notes`` say
    what could not be read.
    """

    label: str
    path: Path
    metrics: dict[str, dict[int, float]]
    events: list[dict[str, Any]]
    config: dict[str, Any]
    finished: bool
    notes: list[str] = field(default_factory=list)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        points = self.metrics.get(key, {})
        steps = sorted(points)
        return steps, [points[s] for s in steps]

    @property
    def last_step(self) -> int | None:
        steps = [s for points in self.metrics.values() for s in points]
        return max(steps) if steps else None


def load_runs(paths: Sequence[str | Path], labels: Sequence[str] | None = None) -> list[Run]:
    """Read every run directory; labels default to the directory names (with parents where two clash)."""
    dirs = [Path(p) for p in paths]
    if not dirs:
        raise ReportError("no run directory given; pass one or more trainer.run_dir directories of `armor run`")
    if labels and len(labels) != len(dirs):
        raise ReportError(
            f"{len(labels)} --label values for {len(dirs)} run directories; give one label per run directory, in order"
        )
    names = list(labels) if labels else _default_labels(dirs)
    return [_load_run(d, name) for d, name in zip(dirs, names)]


def _default_labels(dirs: list[Path]) -> list[str]:
    names = [d.resolve().name for d in dirs]
    if len(set(names)) == len(names):
        return names
    return [f"{d.resolve().parent.name}/{d.resolve().name}" for d in dirs]


def _load_run(path: Path, label: str) -> Run:
    metrics_path = path / "metrics.jsonl"
    if not path.is_dir():
        raise ReportError(
            f"{path} is not a directory; pass a run directory (trainer.run_dir of `armor run`, e.g. runs/default)"
        )
    if not metrics_path.is_file():
        raise ReportError(
            f"{path} has no metrics.jsonl; pass a run directory of `armor run` that logs with the jsonl tracker "
            "(trainer.loggers includes jsonl, the default)"
        )
    notes: list[str] = []
    metrics = _read_metrics(metrics_path, notes)
    config = _read_json(path / "config.json", notes)
    _add_grad_norm_after_clip(metrics, config)
    finished = (path / "summary.json").is_file()
    if not finished:
        notes.append("no summary.json: the run is still going, or it stopped before the end")
    return Run(label, path, metrics, _read_events(path / "guard_events.jsonl", notes), config, finished, notes)


def _read_metrics(path: Path, notes: list[str]) -> dict[str, dict[int, float]]:
    metrics: dict[str, dict[int, float]] = {}
    for lineno, row in _json_lines(path, notes):
        step = row.get("step") if isinstance(row, dict) else None
        if not isinstance(step, int) or isinstance(step, bool):
            notes.append(f"{path.name} line {lineno} has no integer 'step'; left out")
            continue
        for key, raw in row.items():
            value = _number(raw)
            if key != "step" and value is not None:
                metrics.setdefault(key, {})[step] = value
    return metrics


def _read_events(path: Path, notes: list[str]) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    seen, events = set(), []
    for _, event in _json_lines(path, notes):
        if not isinstance(event, dict) or not isinstance(event.get("step"), int) or "action" not in event:
            continue
        identity = json.dumps(event, sort_keys=True)  # the same decision written by each rank
        if identity not in seen:
            seen.add(identity)
            events.append(event)
    return events


def _json_lines(path: Path, notes: list[str]):
    """``(line number, parsed JSON)`` for each line that parses; the others are named in ``notes``."""
    with open(path, "rb") as fh:
        lines = fh.read().split(b"\n")
    last = len(lines) - (1 if lines and lines[-1] == b"" else 0)
    for lineno, line in enumerate(lines[:last], 1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except ValueError:
            where = (
                "its last line is incomplete (being written, or the run stopped mid-line)"
                if lineno == last
                else f"line {lineno} is not JSON"
            )
            notes.append(f"{path.name}: {where}; left out")


def _number(raw: Any) -> float | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(raw, str):  # the jsonl tracker writes non-finite values as "nan", "inf", "-inf"
        return _NON_FINITE.get(raw.lower())
    return None


def _read_json(path: Path, notes: list[str]) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        notes.append(f"no {path.name}")
    except ValueError as e:
        notes.append(f"{path.name} does not parse ({e}); values derived from the config are not drawn")
    return {}


def _add_grad_norm_after_clip(metrics: dict[str, dict[int, float]], config: dict[str, Any]) -> None:
    """clip_grad_norm_ scales the gradients by clip / norm when the norm is above ``actor.grad_clip``
    (a non-finite norm stays non-finite: the gradients it scales are NaN)."""
    clip = (config.get("actor") or {}).get("grad_clip")
    before = metrics.get("actor/grad_norm")
    if before and isinstance(clip, (int, float)) and clip > 0:
        metrics[GRAD_NORM_AFTER_CLIP] = {s: min(v, float(clip)) if math.isfinite(v) else v for s, v in before.items()}
