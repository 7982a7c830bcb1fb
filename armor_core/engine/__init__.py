"""The Ray engine: a local cluster (or an existing one), worker groups, and DataProto dispatch.

- ``cluster.py``: ``init_ray`` (join ``engine.address`` or start a local cluster), ``wait_policy`` /
  ``busy_cores`` (the workers' OpenMP wait policy), the cluster checks made at start, and ``free_port`` (a
  rendezvous port);
- ``group.py``: ``WorkerGroup``, N Ray actors of one worker class acting as data-parallel ranks, called through
  a protocol's methods (``declared_methods``);
- ``dispatch.py``: how a batch is split over the ranks (``balanced_split``) and the results merged (``Pending``);
- ``channel.py``: the direct, authenticated socket to each rank;
- ``errors.py``: ``WorkerDiedError``, ``ChannelError``, ``PlacementError`` and ``death_cause``;
- ``isolation.py``, ``gpu_health.py``: each worker's own cores and devices, and the GPUs' health.

This module only re-exports the names the rest of ARMOR uses.
"""

from __future__ import annotations

from armor_core.engine.cluster import busy_cores, free_port, init_ray, wait_policy
from armor_core.engine.dispatch import Pending, balanced_split
from armor_core.engine.errors import ChannelError, PlacementError, WorkerDiedError, death_cause
from armor_core.engine.group import WorkerGroup, declared_methods

__all__ = [
    "ChannelError",
    "Pending",
    "PlacementError",
    "WorkerDiedError",
    "WorkerGroup",
    "balanced_split",
    "busy_cores",
    "death_cause",
    "declared_methods",
    "free_port",
    "init_ray",
    "wait_policy",
]
