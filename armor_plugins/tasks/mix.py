"""The built-in ``mix`` task: the rows of several tasks in one dataset, to train several domains at once.

``data.task: mix`` with ``data.task_kwargs: {tasks: {arithmetic: {}, facts: {entities: 48}}}``
draws ``data.train_size`` rows split between the named tasks (equally, or in proportion to
``weights``), each made by that task with its own parameters, the same split and the same seed,
then shuffled together with the seed. Each row keeps its ``data_source``, so every row is scored by
its own domain and validation reports accuracy per ``data_source``. Train/test separation is each
task's own: a mix of disjoint splits is disjoint.
"""

from __future__ import annotations

import zlib
from typing import Any, Mapping, Sequence

import numpy as np

from armor_core import Task, get_plugin, hookimpl
from armor_core.hookspecs import RegisterTask

__all__ = ["generate_mix", "shares"]


def shares(size: int, weights: Sequence[float]) -> list[int]:
    """``size`` split in proportion to ``weights`` (largest remainders; ties go to the earlier task)."""
    total = float(sum(weights))
    exact = [size * w / total for w in weights]
    out = [int(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in by_remainder[: size - sum(out)]:
        out[i] += 1
    return out


def _specs(tasks: Any) -> dict[str, dict[str, Any]]:
    """``{task name: its parameters}`` from a mapping or a list of names."""
    if isinstance(tasks, str):
        tasks = [t.strip() for t in tasks.split(",") if t.strip()]
    if isinstance(tasks, Mapping):
        specs = {str(k): dict(v or {}) for k, v in tasks.items()}
    elif isinstance(tasks, Sequence):
        specs = {str(t): {} for t in tasks}
    else:
        specs = {}
    if not specs or any(not isinstance(v, dict) for v in specs.values()):
        raise ValueError(
            f"mix task: tasks={tasks!r} must name the tasks to mix, as a list [arithmetic, facts] or a mapping "
            "{arithmetic: {}, facts: {entities: 48}} of each task's parameters"
        )
    if "mix" in specs:
        raise ValueError("mix task: a mix cannot contain the mix task itself")
    return specs


def generate_mix(
    split: str, size: int, seed: int, *, tasks: Any = None, weights: Mapping[str, float] | None = None, **unknown: Any
) -> list[dict[str, Any]]:
    """Rows of every task in ``tasks``, shuffled together.

    :param tasks: the tasks to mix: a list of names, or a mapping of names to their parameters.
    :param weights: share of the rows per task name (default: equal); a task left out gets 1.
    """
    if unknown:
        raise TypeError(
            f"mix task: unknown parameter(s) {sorted(unknown)}; accepted: tasks, weights (set them in data.task_kwargs)"
        )
    specs = _specs(tasks)
    weights = dict(weights or {})
    extra = sorted(set(weights) - set(specs))
    if extra:
        raise ValueError(f"mix task: weights name {extra}, which are not among the tasks {sorted(specs)}")
    w = [weights.get(name, 1.0) for name in specs]
    if any(isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0 for x in w):
        raise ValueError(f"mix task: weights={weights!r} must be positive numbers")
    rows: list[dict[str, Any]] = []
    for (name, params), n in zip(specs.items(), shares(size, w)):
        if n:
            rows.extend(get_plugin("task", name).fn(split, n, seed, **params))
    split_key = {"val": "test", "validation": "test"}.get(split, split)
    order = np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(split_key.encode())]).permutation(len(rows))
    return [rows[i] for i in order.tolist()]


@hookimpl
def armor_register_tasks(register: RegisterTask) -> None:
    register(
        "mix",
        Task(
            generate_mix,
            description="rows of several tasks together (data.task_kwargs.tasks), e.g. arithmetic and facts",
        ),
    )
