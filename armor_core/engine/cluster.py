"""The Ray cluster: joining one or starting a local one (``init_ray``, its workers' OpenMP wait policy from
``wait_policy``), and the checks that turn a wait without end into a one-line error at start.

- ``check_address``: ``engine.address`` names a host and port where a gRPC server (Ray's GCS, or
  its client server for ``ray://``) answers, within ``engine.connect_timeout_s``. Ray's own client
  retries a silent address, or a port where something else listens, without end. The check is the
  HTTP/2 handshake every gRPC server makes (RFC 7540 3.5: its first frame is SETTINGS), so it tells
  "nothing there" and "not gRPC" from a cluster without logging in to it.
- ``check_capacity``: the cluster's nodes, as they are, can hold every worker's bundle. A placement
  group the cluster can never hold would otherwise wait out its placement timeout (120 s) before
  failing; a shortage the cluster could resolve (resources other jobs hold now) still waits.
- ``reap_orphaned_agents``: before a local cluster starts, the agent processes a cluster killed
  with its driver left behind are stopped.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from armor_core.errors import UserFacingError

__all__ = [
    "ClusterError",
    "address_here",
    "busy_cores",
    "check_address",
    "check_capacity",
    "free_port",
    "init_ray",
    "reap_orphaned_agents",
    "wait_policy",
]

_RETRY_S = 0.5  # between connection attempts: a head node that is starting answers within seconds
# the HTTP/2 client preface and an empty SETTINGS frame (length 0, type 4, flags 0, stream 0)
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4


class ClusterError(UserFacingError):
    """The Ray cluster of ``engine.address`` does not answer, or cannot hold the run's workers."""


def _host_port(address: str) -> tuple[str, int]:
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ClusterError(f"engine.address={address!r}: expected 'auto' or host:port (e.g. 10.0.0.5:6379)")
    return host.strip("[]"), int(port)


def check_address(address: str, timeout_s: float) -> None:
    """Something accepts connections at ``address`` (``host:port`` or ``ray://host:port``) within ``timeout_s``.

    ``auto`` is left to Ray, which reads the address of a cluster started on this machine and
    fails at once when there is none.

    :raises ClusterError: naming the address, the key that sets the wait, and the last socket error.
    """
    if address == "auto":
        return
    host, port = _host_port(address)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=max(0.1, min(5.0, deadline - time.monotonic())))
        except socket.gaierror as e:  # the name does not resolve: waiting will not change that
            raise ClusterError(f"engine.address={address}: host {host!r} is unknown ({e.strerror})") from None
        except OSError as e:
            if time.monotonic() + _RETRY_S >= deadline:
                raise ClusterError(
                    f"engine.address={address}: no Ray cluster answered at {host}:{port} within {timeout_s:g} s "
                    f"(engine.connect_timeout_s) [{e.strerror or type(e).__name__}]. Start one there "
                    f"(ray start --head --port={port}), correct the address, or leave engine.address unset to start "
                    "a local cluster"
                ) from None
            time.sleep(_RETRY_S)
            continue
        with conn:
            if _speaks_grpc(conn, deadline):
                return
        raise ClusterError(
            f"engine.address={address}: something accepts connections at {host}:{port}, but it is not a Ray cluster "
            f"(no gRPC handshake within {timeout_s:g} s, engine.connect_timeout_s). Give the head node's GCS port "
            "(ray start --head prints it; 6379 by default), or ray://HOST:10001 for a Ray client server"
        )


def _speaks_grpc(conn: socket.socket, deadline: float) -> bool:
    """Whether the server on ``conn`` answers the HTTP/2 preface with a SETTINGS frame before ``deadline``."""
    try:
        conn.settimeout(max(0.1, deadline - time.monotonic()))
        conn.sendall(_H2_HELLO)
        header = b""
        while len(header) < 9:  # a frame header: length (3 bytes), type, flags, stream id (4)
            chunk = conn.recv(9 - len(header))
            if not chunk:
                return False
            header += chunk
    except OSError:  # timed out, or reset: not a gRPC server
        return False
    return header[3] == _SETTINGS


def check_capacity(
    nodes: list[Mapping[str, Any]], groups: Mapping[str, int], cpus_per_worker: float, gpus_per_worker: float
) -> None:
    """Whether ``nodes`` (each node's total resources, ``{"CPU": 4, "GPU": 1, ...}``) can hold
    ``groups`` (worker group name: workers), each worker a bundle of ``cpus_per_worker`` CPUs and
    ``gpus_per_worker`` GPUs.

    :raises ClusterError: naming what is needed, what the cluster has, and the keys that set both.
    """
    n = sum(groups.values())
    need = {"CPU": cpus_per_worker, "GPU": gpus_per_worker}
    have = {r: sum(float(node.get(r, 0)) for node in nodes) for r in need}
    workers = " + ".join(f"{count} {name}" for name, count in groups.items())
    keys = "engine.num_cpus (a local cluster), actor.num_workers, engine.cpus_per_worker, engine.gpus_per_worker"
    for resource, each in need.items():
        if each and n * each > have[resource] + 1e-9:
            raise ClusterError(
                f"the workers need {n * each:g} {resource}s ({workers} workers x {each:g}), but the Ray cluster has "
                f"{have[resource]:g}; they could never be placed. Fit them with {keys}, or add nodes"
            )
    if not any(all(float(node.get(r, 0)) + 1e-9 >= each for r, each in need.items() if each) for node in nodes):
        widest = max((float(node.get("CPU", 0)) for node in nodes), default=0.0)
        raise ClusterError(
            f"a worker needs {cpus_per_worker:g} CPUs and {gpus_per_worker:g} GPUs on one node, but no node of the "
            f"Ray cluster has that much (the largest has {widest:g} CPUs); lower engine.cpus_per_worker / "
            "engine.gpus_per_worker"
        )


#: the helper processes a raylet starts beside each node; they outlive a raylet killed with its driver
_AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


def reap_orphaned_agents() -> int:
    """Stop this user's Ray agent processes whose raylet is gone; the number stopped.

    A local cluster's raylet and GCS die with a driver killed by ``kill -9``, but its dashboard and
    runtime-env agents notice only after a minute or so, and hold memory and ports meanwhile. An
    agent whose parent is no raylet (it was re-parented) belongs to such a dead cluster; the next
    local start stops it. Agents of live clusters, and other users' processes, are left alone.
    """
    import os

    import psutil

    stopped = []
    for proc in psutil.process_iter(["cmdline", "uids"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if not cmdline or cmdline[0] not in _AGENTS or proc.info["uids"].real != os.getuid():
                continue
            parent = proc.parent()
            if parent is not None and "raylet" in " ".join(parent.cmdline()[:1]):
                continue  # a live cluster's agent
            proc.kill()
            stopped.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    psutil.wait_procs(stopped, timeout=5)
    return len(stopped)


def init_ray(
    address: str | None,
    num_cpus: int | None,
    needed_cpus: float,
    connect_timeout_s: float = 30.0,
    omp_wait_policy: str = "active",
) -> None:
    """Join ``address`` (``ClusterError`` if nothing answers there within ``connect_timeout_s``) or
    start a local cluster with enough logical CPUs for every worker, whose OpenMP threads wait
    ``omp_wait_policy`` (``active`` or ``passive``; see ``wait_policy``)."""
    import ray

    if ray.is_initialized():
        return
    env = {
        "env_vars": {
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONWARNINGS": "ignore",
            "TRANSFORMERS_VERBOSITY": "error",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "OMP_WAIT_POLICY": omp_wait_policy.upper(),
        }
    }
    if address:
        check_address(address, connect_timeout_s)
        try:
            ray.init(address=address, runtime_env=env, log_to_driver=True)
        except ConnectionError as e:  # 'auto' with no cluster on this machine, or not a Ray head at that port
            raise ClusterError(f"engine.address={address}: {' '.join(str(e).split())}") from None
        return
    reaped = reap_orphaned_agents()
    if reaped:
        print(f"stopped {reaped} Ray agent process(es) left by an earlier run that was killed")
    cpus = num_cpus or max(os.cpu_count() or 1, int(np.ceil(needed_cpus)))
    ray.init(num_cpus=cpus, include_dashboard=False, runtime_env=env, log_to_driver=True, configure_logging=False)


def _proc_stat() -> str:
    return Path("/proc/stat").read_text()


def busy_cores(
    seconds: float = 0.3,
    *,
    read_stat: Callable[[], str] = _proc_stat,
    sleep: Callable[[float], None] = time.sleep,
    cpus: int | None = None,
) -> float:
    """Cores kept busy by other processes over ``seconds``, from ``/proc/stat`` (0.0 where it cannot be read).
    ``read_stat``, ``sleep`` and ``cpus`` (default ``os.cpu_count()``) are the machine's; a test passes its own."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in read_stat().splitlines()[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]), idle

    try:
        total0, idle0 = sample()
        sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return 0.0
    elapsed = max(total1 - total0, 1)
    return (elapsed - (idle1 - idle0)) / elapsed * (cpus or os.cpu_count() or 1)


def wait_policy(setting: str, busy: Callable[[], float] = busy_cores) -> str:
    """``engine.omp_wait_policy`` resolved: ``auto`` is ``passive`` when other processes keep half a core or more
    busy as the run starts. Spinning threads that share a core with another busy process slow a step by tens of
    times, sleeping ones by under 2x, at a cost when the cores are free (``benchmarks/contention.py``)."""
    if setting != "auto":
        return setting
    return "passive" if busy() >= 0.5 else "active"


def address_here() -> tuple[str, int]:
    """This node's IP and a port free on it: a group's rendezvous, asked on the node of its rank 0."""
    import ray

    return ray.util.get_node_ip_address(), free_port()


def free_port() -> int:
    """A TCP port free on every interface of this machine now (for a rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("", 0))  # free on every interface: peers on other nodes connect to it
        return s.getsockname()[1]
