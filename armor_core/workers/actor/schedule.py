"""The learning-rate schedule shared by RL training (``actor.lr_schedule``) and ``armor sft``."""

from __future__ import annotations

import math
from typing import Callable

__all__ = ["SCHEDULES", "lr_factor"]

SCHEDULES = ("constant", "cosine", "linear")


def lr_factor(warmup: int, schedule: str, total: int) -> Callable[[int], float]:
    """Multiplier of the peak learning rate at optimizer step ``s`` (0-based): a linear warm-up over
    ``warmup`` steps, then ``schedule`` (constant, or cosine / linear decay to 0 at step ``total``)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"lr_schedule={schedule!r} is not one of {', '.join(repr(s) for s in SCHEDULES)}")

    def factor(s: int) -> float:
        if s < warmup:
            return (s + 1) / warmup
        if schedule == "constant" or total <= warmup:
            return 1.0
        progress = min(1.0, (s - warmup) / (total - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress)) if schedule == "cosine" else 1.0 - progress

    return factor
