"""Seconds per stage of a training step: ``StepTimer``.

A stage that calls workers sets ``worker_s`` (from ``perf/worker_s`` in what they return); its wall
time beyond that (calls to workers, serialisation, dispatch, waiting for the slowest rank) goes to
``timing_s/overhead``, so the stages add up to ``timing_s/step``.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

__all__ = ["ENGINE_STAGES", "StepTimer"]

#: stages that are the engine's own cost, not generation, reward, algorithm or training compute
ENGINE_STAGES = ("data", "update_weights", "overhead", "log", "rollback_point", "other")


class _Stage:
    worker_s: float | None = None  # seconds the workers report spending inside the call


class StepTimer:
    """``with timer("gen") as stage: ...`` adds the block's seconds to ``timing_s/gen`` (``t``)."""

    def __init__(self) -> None:
        self.t: dict[str, float] = {}

    def add(self, name: str, seconds: float) -> None:
        self.t[f"timing_s/{name}"] = self.t.get(f"timing_s/{name}", 0.0) + seconds

    @contextmanager
    def __call__(self, name: str) -> Iterator[_Stage]:
        t0 = time.perf_counter()
        stage = _Stage()
        yield stage
        wall = time.perf_counter() - t0
        inside = wall if stage.worker_s is None else min(wall, stage.worker_s)
        self.add(name, inside)
        if stage.worker_s is not None:
            self.add("overhead", wall - inside)
