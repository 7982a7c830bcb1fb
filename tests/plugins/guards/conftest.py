"""What the guard tests share: ``run`` feeds a guard one observation per step, ``actions`` reads the verdicts'
actions."""

from __future__ import annotations

import pytest


def _run(guard, stage, values, key=None, **extra):
    """Observe ``values`` one per step (as ``{key: v, **extra}``); ``[(action, verdict)]``."""
    out = []
    for i, v in enumerate(values):
        stats = dict(extra)
        if key is not None:
            stats[key] = v
        elif isinstance(v, dict):
            stats.update(v)
        verdict = guard.observe(stage, stats, i + 1)
        out.append(verdict)
    return out


def _actions(verdicts):
    return [v.action for v in verdicts]


@pytest.fixture(scope="session")
def run():
    """``run(guard, stage, values, key=None, **extra)``: ``guard.observe`` each value at steps 1, 2, ...; the
    verdicts."""
    return _run


@pytest.fixture(scope="session")
def actions():
    """``actions(verdicts)``: each verdict's action."""
    return _actions
