"""ProcessIsolator: each worker process owns its devices, and the assignment is checked before any model is built.

Two workers that share a GPU run out of memory or slow each other down unpredictably; two that
share cores (or each start one OpenMP thread per core of the machine) oversubscribe the CPU and
make timings, and with some kernels results, depend on what else runs. So, per node:

1. The driver plans (:func:`plan_assignment`, pure): worker ``rank`` of ``group`` gets
   ``cpus_per_worker`` whole cores out of the cores this process may use
   (``os.sched_getaffinity``) and ``gpus_per_worker`` GPUs out of the ones the user made visible
   (``CUDA_VISIBLE_DEVICES``, never widened). :func:`check_exclusive` refuses a plan in which two
   workers claim the same core or GPU, naming both. On GPU machines ``gpu_health.device_health``
   reads free memory, temperature and uncorrected ECC errors through NVML (``pynvml``) or
   ``nvidia-smi``, and :func:`check_health` can refuse a device.
2. Each worker, first thing in its process, calls :func:`apply_assignment`: core affinity,
   torch/OpenMP/MKL thread counts equal to its cores, ``CUDA_VISIBLE_DEVICES`` narrowed to its
   GPUs, and seeds ``seed + rank``. It returns a record of what now holds (read back, not assumed).
3. The driver prints the records (:func:`format_assignment`) and saves them
   (:func:`write_assignment`, ``isolation.json`` in the run directory).

:class:`ProcessIsolator` bundles the driver's side. Ray may place workers on several nodes; call
the planner once per node with that node's workers and resources (``node=`` keeps the records apart).
"""

from __future__ import annotations

import json
import math
import os
import random
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from armor_core.engine import gpu_health
from armor_core.engine.gpu_health import device_health

__all__ = [
    "Assignment",
    "IsolationError",
    "ProcessIsolator",
    "apply_assignment",
    "check_exclusive",
    "check_health",
    "detect_available_cpus",
    "detect_visible_gpus",
    "format_assignment",
    "parse_visible_devices",
    "plan_assignment",
    "write_assignment",
]

ENV_GPUS = "CUDA_VISIBLE_DEVICES"
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class IsolationError(RuntimeError):
    """A worker cannot get devices of its own; the message says which worker, which device, and why."""


@dataclass(frozen=True)
class Assignment:
    """The devices of one worker process. ``gpus`` are entries of the user's ``CUDA_VISIBLE_DEVICES``
    (indices, ``GPU-...`` UUIDs or ``MIG-...`` ids, kept as written)."""

    group: str
    rank: int
    cpus: tuple[int, ...]
    gpus: tuple[str, ...]
    node: str = ""

    @property
    def name(self) -> str:
        return f"{self.group} rank {self.rank}" + (f" on {self.node}" if self.node else "")


# -- what this process may use ------------------------------------------------------------------


def parse_visible_devices(value: str) -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` as a list. Like CUDA, an invalid entry (empty, ``-1``) ends the list."""
    out = []
    for token in value.split(","):
        token = token.strip()
        if not token or token.startswith("-"):
            break
        out.append(token)
    return out


def detect_available_cpus() -> list[int]:
    """The cores this process may run on (its affinity mask, which cgroups and ``taskset`` narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))  # macOS/Windows: no affinity API


def detect_visible_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """The user's ``CUDA_VISIBLE_DEVICES`` when set, else every device CUDA reports ("0", "1", ...)."""
    env = os.environ if environ is None else environ
    if ENV_GPUS in env:
        return parse_visible_devices(env[ENV_GPUS])
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no torch, or a broken driver: no GPU is usable either way
        return []


# -- planning (pure) ----------------------------------------------------------------------------


def _whole(name: str, value: float) -> int:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0 and float(value).is_integer()):
        raise IsolationError(
            f"{name}={value!r} (engine.{name}): process isolation gives each worker whole, exclusive devices; "
            f"use an integer >= 1, or 0 to leave them unassigned"
        )
    return int(value)


def plan_assignment(
    n_workers_by_group: Mapping[str, int],
    cpus_per_worker: float,
    gpus_per_worker: float,
    available_cpus: Sequence[int],
    visible_gpus: Sequence[str] | None,
    *,
    node: str = "",
) -> list[Assignment]:
    """Give every worker of one node its own cores and GPUs, in group order then rank order.

    :param n_workers_by_group: ``{"actor": 2, "critic": 1}``: workers on this node per group.
    :param cpus_per_worker: whole cores per worker (0: leave CPU placement alone).
    :param gpus_per_worker: whole GPUs per worker (0: none).
    :param available_cpus: cores this process may use (:func:`detect_available_cpus`).
    :param visible_gpus: the user's visible GPUs (:func:`detect_visible_gpus`); None means none.
    :returns: one :class:`Assignment` per worker; consecutive workers get consecutive cores of
        ``sorted(available_cpus)`` and consecutive GPUs in the user's order.
    :raises IsolationError: resources are short (the message names what was asked and what exists).
    """
    c, g = _whole("cpus_per_worker", cpus_per_worker), _whole("gpus_per_worker", gpus_per_worker)
    for group, n in n_workers_by_group.items():
        if not isinstance(n, int) or n < 0:
            raise IsolationError(f"worker group {group!r}: {n!r} workers; expected an integer >= 0")
    workers = [(group, rank) for group, n in n_workers_by_group.items() for rank in range(n)]
    cpus = sorted(set(int(x) for x in available_cpus))
    gpus = list(dict.fromkeys(str(x) for x in (visible_gpus or [])))
    at = f" on node {node}" if node else ""
    asked = f"{len(workers)} workers ({', '.join(f'{grp}: {n}' for grp, n in n_workers_by_group.items())})"
    if len(workers) * c > len(cpus):
        raise IsolationError(
            f"not enough CPU cores{at}: {asked} x {c} core(s) each = {len(workers) * c} cores, but this process may "
            f"use {len(cpus)}: {cpus} (os.sched_getaffinity). Lower engine.cpus_per_worker, run fewer workers, or "
            "give the run more cores."
        )
    if len(workers) * g > len(gpus):
        raise IsolationError(
            f"not enough GPUs{at}: {asked} x {g} GPU(s) each = {len(workers) * g} GPUs, but {len(gpus)} are "
            f"visible: {gpus} ({ENV_GPUS} or the device count). Lower engine.gpus_per_worker, run fewer workers, or "
            "make more GPUs visible."
        )
    return [
        Assignment(group, rank, tuple(cpus[i * c : (i + 1) * c]), tuple(gpus[i * g : (i + 1) * g]), node)
        for i, (group, rank) in enumerate(workers)
    ]


def check_exclusive(assignments: Iterable[Assignment]) -> None:
    """Raise if two workers (on the same node) claim the same core or GPU, naming both and the device."""
    owner: dict[tuple[str, str, str], Assignment] = {}
    clashes, seen = [], set()
    for a in assignments:
        if (a.node, a.group, a.rank) in seen:
            clashes.append(f"{a.name} is planned twice")
        seen.add((a.node, a.group, a.rank))
        for kind, devices in (("CPU core", a.cpus), ("GPU", a.gpus)):
            for d in devices:
                key = (a.node, kind, str(d))
                other = owner.setdefault(key, a)
                if other is not a:
                    clashes.append(f"{other.name} and {a.name} both claim {kind} {d}")
    if clashes:
        raise IsolationError(
            "workers would share devices: " + "; ".join(clashes) + ". Every worker needs cores and GPUs of its own."
        )


# -- in the worker process ----------------------------------------------------------------------


def apply_assignment(a: Assignment, seed: int, *, hide_gpus_when_none: bool = True) -> dict[str, Any]:
    """Make this process use only ``a``'s devices; call it first thing in the worker, before any model.

    * cores: ``os.sched_setaffinity`` to ``a.cpus``; torch intra-op threads and ``OMP_NUM_THREADS``,
      ``MKL_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` (read by libraries and subprocesses started
      later) set to ``len(a.cpus)``. Nothing changes when ``a.cpus`` is empty.
    * GPUs: ``CUDA_VISIBLE_DEVICES`` set to ``a.gpus``, which must all be in the mask this process
      inherited (if it has one): the user's mask is narrowed, never widened. A worker without GPUs
      gets an empty mask (unless ``hide_gpus_when_none`` is False), so it cannot touch another's.
      CUDA reads the variable once, at initialisation: if it is already initialised here, this fails.
    * seeds: ``random``, ``numpy`` and ``torch`` seeded with ``seed + a.rank``.

    :returns: a JSON-able record of what now holds, read back from the process: ``pid``,
        ``hostname``, ``node``, ``group``, ``rank``, ``cpus``, ``gpus``, ``cuda_visible_devices``,
        ``threads``, ``seed``.
    :raises IsolationError: a core is outside this process's mask, or a GPU outside the user's.
    """
    import numpy as np
    import torch

    # check everything before changing anything, so a refused assignment leaves the process as it was
    inherited = os.environ.get(ENV_GPUS)
    set_gpus = bool(a.gpus) or hide_gpus_when_none
    outside = [g for g in a.gpus if inherited is not None and g not in parse_visible_devices(inherited)]
    if outside:
        raise IsolationError(
            f"{a.name}: GPUs {outside} are not in this process's {ENV_GPUS}={inherited!r}; "
            "ARMOR narrows the user's mask and never widens it. Plan from the mask the workers inherit."
        )
    if set_gpus and torch.cuda.is_initialized() and ",".join(a.gpus) != inherited:
        raise IsolationError(
            f"{a.name}: CUDA was initialised in this process before apply_assignment, so {ENV_GPUS} "
            "can no longer take effect; call it before anything touches torch.cuda"
        )
    if a.cpus:
        _pin_cores(a)
    if set_gpus:
        os.environ[ENV_GPUS] = ",".join(a.gpus)
    s = int(seed) + a.rank
    random.seed(s)
    np.random.seed(s % 2**32)  # the legacy global generator only takes 32-bit seeds
    torch.manual_seed(s)
    return {
        "pid": os.getpid(),
        "hostname": socket.gethostname(),
        "node": a.node,
        "group": a.group,
        "rank": a.rank,
        "cpus": detect_available_cpus(),
        "gpus": list(a.gpus),
        "cuda_visible_devices": os.environ.get(ENV_GPUS),
        "threads": torch.get_num_threads(),
        "seed": s,
    }


def _pin_cores(a: Assignment) -> None:
    """This process on ``a.cpus`` only (checked against what the kernel gave), with as many torch and library
    threads as cores."""
    import torch

    if hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, a.cpus)
        except OSError as e:
            raise IsolationError(
                f"{a.name}: cannot pin to cores {list(a.cpus)}: {e}; this process may use {detect_available_cpus()}"
            ) from e
        got = sorted(os.sched_getaffinity(0))
        if got != sorted(a.cpus):
            raise IsolationError(f"{a.name}: asked for cores {sorted(a.cpus)}, the kernel gave {got}")
    torch.set_num_threads(len(a.cpus))
    for var in THREAD_ENV:
        os.environ[var] = str(len(a.cpus))


# -- GPU health (readings in gpu_health.py) -------------------------------------------------


def check_health(
    assignments: Iterable[Assignment],
    health: Sequence[Mapping[str, Any]],
    *,
    min_free_mib: float | None = 1024.0,
    max_temperature_c: float | None = 90.0,
    max_ecc_errors: int | None = 0,
) -> None:
    """Refuse a plan that puts a worker on an unhealthy GPU (``health``: ``device_health()``; a None limit is not
    checked).

    Index entries are matched to NVML indices, which equal CUDA ordinals under
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; give UUIDs in ``CUDA_VISIBLE_DEVICES`` to be sure.

    :raises IsolationError: naming each worker, device and reading that fails a limit.
    """
    found = gpu_health.problems(assignments, health, min_free_mib, max_temperature_c, max_ecc_errors)
    if found:
        raise IsolationError(
            "unhealthy GPUs: " + "; ".join(found) + ". Exclude them from CUDA_VISIBLE_DEVICES or relax the limits."
        )


# -- report -------------------------------------------------------------------------------------


def format_assignment(records: Sequence[Mapping[str, Any]]) -> str:
    """A table of the records, one worker per line, for the console."""

    def span(xs: Sequence[Any]) -> str:
        return ",".join(str(x) for x in xs) if xs else "-"

    lines = [f"{'worker':<18} {'pid':>7} {'host':<16} {'cpus':<12} {'gpus':<10} {'threads':>7} {'seed':>6}"]
    for r in sorted(records, key=lambda r: (r.get("node", ""), r["group"], r["rank"])):
        lines.append(
            f"{r['group'] + ' ' + str(r['rank']):<18} {r['pid']:>7} {str(r['hostname'])[:16]:<16} "
            f"{span(r['cpus']):<12} {span(r['gpus']):<10} {r['threads']:>7} {r['seed']:>6}"
        )
    return "\n".join(lines)


def write_assignment(
    run_dir: str | Path, records: Sequence[Mapping[str, Any]], health: Sequence[Mapping[str, Any]] = ()
) -> Path:
    """Write ``{"workers": records, "devices": health}`` to ``run_dir/isolation.json``; returns the path."""
    path = Path(run_dir) / "isolation.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    workers = sorted((dict(r) for r in records), key=lambda r: (r.get("node", ""), r["group"], r["rank"]))
    path.write_text(json.dumps({"workers": workers, "devices": list(health)}, indent=2))
    return path


class ProcessIsolator:
    """The driver's side: plan and check once, then report what the workers applied.

    :param cpus_per_worker: ``engine.cpus_per_worker`` (whole cores; 0 leaves CPU placement alone).
    :param gpus_per_worker: ``engine.gpus_per_worker`` (whole GPUs).
    :param seed: ``trainer.seed``; worker ``rank`` is seeded with ``seed + rank``.
    :param refuse_unhealthy: run :func:`check_health` on the planned GPUs with the limits below.
    """

    def __init__(
        self,
        cpus_per_worker: float = 1,
        gpus_per_worker: float = 0,
        seed: int = 1,
        *,
        refuse_unhealthy: bool = True,
        min_free_mib: float | None = 1024.0,
        max_temperature_c: float | None = 90.0,
        max_ecc_errors: int | None = 0,
    ) -> None:
        self.cpus_per_worker, self.gpus_per_worker, self.seed = cpus_per_worker, gpus_per_worker, int(seed)
        self.refuse_unhealthy = refuse_unhealthy
        self.limits = {
            "min_free_mib": min_free_mib,
            "max_temperature_c": max_temperature_c,
            "max_ecc_errors": max_ecc_errors,
        }
        self.health: list[dict[str, Any]] = []

    def plan(
        self,
        n_workers_by_group: Mapping[str, int],
        available_cpus: Sequence[int] | None = None,
        visible_gpus: Sequence[str] | None = None,
        *,
        node: str = "",
    ) -> list[Assignment]:
        """Plan one node (this process's resources unless given), check exclusivity and GPU health."""
        cpus = detect_available_cpus() if available_cpus is None else available_cpus
        gpus = (detect_visible_gpus() if self.gpus_per_worker else []) if visible_gpus is None else visible_gpus
        plan = plan_assignment(n_workers_by_group, self.cpus_per_worker, self.gpus_per_worker, cpus, gpus, node=node)
        check_exclusive(plan)
        if any(a.gpus for a in plan):
            self.health = device_health()
            if self.refuse_unhealthy:
                check_health(plan, self.health, **self.limits)
        return plan

    def report(
        self, records: Sequence[Mapping[str, Any]], run_dir: str | Path | None = None, *, echo: bool = True
    ) -> Path | None:
        """Print the records and write ``isolation.json`` (with the device health) when ``run_dir`` is given."""
        if echo:
            print(format_assignment(records))
        return write_assignment(run_dir, records, self.health) if run_dir is not None else None
