"""The one rule by which metrics from several workers (or several batches) become one value each.

Seconds (names ending in ``_s``) and maxima (names containing ``max``) take the largest value: a
step waits for its slowest rank, and a maximum over ranks is the maximum of their maxima. Every
other number takes the mean over the values present (a rank that did not report a name adds
nothing to it). A non-numeric value (a label) must be the same everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["merge_metrics", "takes_max"]


def takes_max(name: str) -> bool:
    """Whether ``name`` merges by maximum (seconds, maxima) rather than by mean."""
    return name.endswith("_s") or "max" in name.rsplit("/", 1)[-1]


def merge_metrics(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``{name: merged value}`` over ``parts`` (e.g. one dict per rank), by the rule above."""
    values: dict[str, list[Any]] = {}
    for i, part in enumerate(parts):
        if not isinstance(part, Mapping):
            raise TypeError(
                f"merge_metrics: part {i} is a {type(part).__name__}; expected a dict of metric name -> value"
            )
        for name, value in part.items():
            values.setdefault(name, []).append(value)
    merged: dict[str, Any] = {}
    for name, vals in values.items():
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            floats = [float(v) for v in vals]
            merged[name] = max(floats) if takes_max(name) else math.fsum(floats) / len(floats)
        elif all(v == vals[0] for v in vals):
            merged[name] = vals[0]
        else:
            raise ValueError(
                f"merge_metrics: {name!r} has different non-numeric values {vals!r}; only numbers are merged"
            )
    return merged
