"""Worker groups: N Ray actors of one worker class acting as data-parallel ranks, and DataProto dispatch.

A ``WorkerGroup`` is N Ray actors of one worker class, placed together by a placement group, that
act as data-parallel ranks 0..N-1. The driver talks to the group, not to ranks:

- ``group.call(API.method, *args)`` runs the method on every rank and returns the list of results;
- ``group.dispatch(API.method, data, *args)`` splits a DataProto into N shares (balanced by valid tokens, see
  ``balanced_split``), runs the method on each rank with its share, and concatenates the returned DataProtos in
  the original row order; metric dicts (returned, or a DataProto's ``meta_info["metrics"]``) are merged by
  ``armor_core.dataproto.metrics.merge_metrics``.

A method is named by reference to the group's protocol (``armor_core.workers.api``: ``ActorAPI``,
``CriticAPI``, ``RolloutAPI``), never by a string: the group checks at start-up that its worker
class defines every method of the protocol, and at each call that the method is one of them.

Rollout, actor and reference live in one worker class (``ActorWorker``), so generation and
training share weights without a transfer; a separate rollout group is a matter of another class.

Placement: one placement-group bundle per rank (``cpus_per_worker`` CPUs, ``gpus_per_worker`` GPUs), strategy
PACK: as few nodes as hold the group, spreading over more when one is too small. ``placement`` records where each
rank landed (node id and IP, pid). The ranks rendezvous at rank 0's node IP on a port free there (asked on that
node), so a group may span machines.

Calls: once a group is up, every call goes over a direct socket to each rank (``channel.py``), quicker
than a Ray actor call (docs/performance.md); Ray still places, starts, watches and stops the workers.
``channel=False`` keeps Ray's task path.

Failures: a call never blocks on a dead rank. Results are awaited one at a time (``ray.wait``, or a wait on the
channels' sockets, where a dead rank's socket closes); the first rank that dies (killed, out of memory, crashed) or
raises while the others are still waiting (they would sit in a collective until gloo's 30-minute timeout) ends the
whole group, and ``WorkerDiedError`` names the group, rank, node, pid and Ray's account of the cause.
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Callable, cast

import numpy as np

from armor_core.dataproto.protocol import DataProto
from armor_core.engine.cluster import address_here
from armor_core.engine.dispatch import Pending, shares
from armor_core.engine.errors import ChannelError, PlacementError, WorkerDiedError, death_cause

if TYPE_CHECKING:
    from ray import ObjectRef

__all__ = ["WorkerGroup", "declared_methods"]

# how long the other ranks get to finish after one rank raised: a healthy group returns in
# milliseconds, a group stuck in a collective with the failed rank never does
FAILURE_GRACE_S = 10.0


class WorkerGroup:
    """N Ray actors of ``worker_cls`` acting as data-parallel ranks."""

    def __init__(
        self,
        worker_cls: type,
        n: int,
        *,
        cpus_per_worker: float,
        gpus_per_worker: float,
        name: str,
        init_kwargs: dict[str, Any],
        api: type | None = None,
        rank_kwargs: list[dict[str, Any]] | None = None,
        placement_timeout_s: float = 120.0,
        channel: bool = True,
    ) -> None:
        """``api``: the protocol the driver calls the workers through (``armor_core.workers.api``);
        None: the worker class itself (tests, benchmarks)."""
        self.api = api or worker_cls
        missing = [m for m in declared_methods(self.api) if not callable(getattr(worker_cls, m, None))]
        if missing:
            raise TypeError(
                f"worker group '{name}': {worker_cls.__name__} does not define {missing}, "
                f"declared by {self.api.__name__}"
            )
        self.n, self.name, self.workers = n, name, []
        self.conns: list[Connection] = []  # the direct channel to each rank, once open
        self._seq = 0  # number of the last call sent over the channel
        self._early: dict[int, dict[int, tuple[bool, Any]]] = {}  # replies read before their call was gathered
        self._place(cpus_per_worker, gpus_per_worker, placement_timeout_s)
        self._spawn(worker_cls, init_kwargs, rank_kwargs, cpus_per_worker, gpus_per_worker, placement_timeout_s)
        # surface construction errors (bad model path, ...) now, naming the worker
        for rec, info in zip(self.placement, self.call(self.api.ping)):
            rec["pid"] = info.get("pid") if isinstance(info, dict) else None
        if channel:
            self._open_channels(placement_timeout_s)

    def _place(self, cpus_per_worker: float, gpus_per_worker: float, placement_timeout_s: float) -> None:
        """The placement group, one bundle per rank (PACK), and where each rank landed (``placement``)."""
        import ray
        from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

        n, name = self.n, self.name
        bundle = {"CPU": cpus_per_worker, **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
        self.pg = placement_group([bundle] * n, strategy="PACK")
        ready, _ = ray.wait([self.pg.ready()], timeout=placement_timeout_s)
        if not ready:
            remove_placement_group(self.pg)
            raise PlacementError(
                f"worker group '{name}': {n} workers x {bundle} could not be placed within "
                f"{placement_timeout_s:.0f} s; the cluster has "
                f"{ray.available_resources()} available of {ray.cluster_resources()}. Lower actor.num_workers / "
                "engine.cpus_per_worker / engine.gpus_per_worker, or add nodes (`ray start --address ...`)."
            )
        node_of_bundle = placement_group_table(self.pg)["bundles_to_node_id"]
        ips = {nd["NodeID"]: nd["NodeManagerAddress"] for nd in ray.nodes()}
        self.placement = [
            {"group": name, "rank": r, "node_id": node_of_bundle[r], "node_ip": ips.get(node_of_bundle[r], "?")}
            for r in range(n)
        ]

    def _spawn(
        self,
        worker_cls: type,
        init_kwargs: dict[str, Any],
        rank_kwargs: list[dict[str, Any]] | None,
        cpus_per_worker: float,
        gpus_per_worker: float,
        placement_timeout_s: float,
    ) -> None:
        """One Ray actor per rank in its bundle; with several ranks, the rendezvous address is rank 0's node and a
        port free there."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        n, name, pg = self.n, self.name, self.pg
        assert pg is not None  # _place made it
        env = {}
        if n > 1:
            # rank 0's node and a port free there: 127.0.0.1 would not reach it from another machine
            probe = ray.remote(num_cpus=0)(address_here).options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)
            )
            addr, port = ray.get(probe.remote(), timeout=placement_timeout_s)
            env = {"MASTER_ADDR": addr, "MASTER_PORT": str(port)}
        remote_cls = ray.remote(worker_cls)
        for rank in range(n):
            opts = dict(
                num_cpus=cpus_per_worker,
                num_gpus=gpus_per_worker,
                name=f"armor-{name}-{rank}-{os.getpid()}-{id(self)}",
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=rank),
                runtime_env={"env_vars": {**env, "OMP_NUM_THREADS": str(max(1, int(cpus_per_worker)))}},
            )
            per_rank = rank_kwargs[rank] if rank_kwargs else {}
            self.workers.append(remote_cls.options(**opts).remote(**init_kwargs, **per_rank, rank=rank, world_size=n))

    def _open_channels(self, timeout_s: float) -> None:
        import ray

        from armor_core.engine.channel import connect, listen_host, open_channel

        key = os.urandom(32)
        host = listen_host()  # loopback on a one-machine cluster
        addresses = ray.get([w.__ray_call__.remote(open_channel, key, host) for w in self.workers], timeout=timeout_s)
        for rank, address in enumerate(addresses):
            try:
                self.conns.append(connect(tuple(address), key))
            except OSError as e:
                self.shutdown()
                raise ChannelError(
                    f"{self.describe(rank)} listens at {address[0]}:{address[1]} for the driver's calls, "
                    f"but the driver could not connect: {e}. A firewall between the nodes? "
                    "engine.direct_channel=false calls the workers through Ray only."
                ) from e

    def describe(self, rank: int) -> str:
        rec = self.placement[rank] if rank < len(getattr(self, "placement", [])) else {}
        return (
            f"worker group '{self.name}' rank {rank} (pid {rec.get('pid', '?')}, node {rec.get('node_ip', '?')} "
            f"{str(rec.get('node_id', '?'))[:12]})"
        )

    def _name(self, method: Callable[..., Any]) -> str:
        """The name of ``method``, a function of the group's protocol (``ActorAPI.update_actor``)."""
        name = getattr(method, "__name__", None)
        if isinstance(method, str) or name is None or getattr(self.api, name, None) is not method:
            raise TypeError(
                f"worker group '{self.name}': {method!r} is not a method of {self.api.__name__}; "
                "name a worker method by "
                f"reference, e.g. {self.api.__name__}.{next(iter(declared_methods(self.api)), 'method')}"
            )
        return name

    def call_rank(self, rank: int, method: Callable[..., Any], *args: Any) -> ObjectRef:
        """``method(*args)`` on one rank through Ray, beside the channel's calls (it may run while
        the rank is inside another call); returns Ray's reference to the result."""
        return getattr(self.workers[rank], self._name(method)).remote(*args)

    def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        return self.submit_call(method, *args, **kwargs).result()

    def submit_call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Pending:
        """``call`` without waiting: each rank queues the method behind the ones sent before (a Ray
        actor runs its calls one at a time, in order); ``.result()`` gathers, as ``call`` returns."""
        return self._send(self._name(method), [args] * self.n, kwargs, None)

    def _send(
        self, method: str, rank_args: list[tuple], kwargs: dict[str, Any], parts: list[list[np.ndarray]] | None
    ) -> Pending:
        """``method(*rank_args[r], **kwargs)`` on each rank r, over the channel when it is open."""
        if not self.conns:
            return Pending(
                self, method, [getattr(w, method).remote(*a, **kwargs) for w, a in zip(self.workers, rank_args)], parts
            )
        from armor_core.engine.channel import encode, write

        # every rank's request pickled before any is sent: one that cannot be pickled must not leave
        # the others running the method alone (waiting in its collectives for a rank that never got it)
        messages = [encode((self._seq + 1, method, a, kwargs)) for a in rank_args]
        self._seq += 1
        for rank, (conn, message) in enumerate(zip(self.conns, messages)):
            try:
                write(conn, message)
            except OSError:  # its end of the socket is gone: the process died
                self._raise_dead(rank, method)
        return Pending(self, method, self._seq, parts)

    def gather(self, refs: list[ObjectRef] | int, method: str) -> list[Any]:
        """The ranks' results of a call sent by ``_send`` (what ``Pending.result`` waits on), in rank order: ``refs``
        is Ray's references, or the number of a call sent over the channel. The first rank to die, or to fail while
        the others wait on it, stops the group (``WorkerDiedError``)."""
        if isinstance(refs, int):
            return self._gather_channel(refs, method)
        return self._gather_ray(refs, method)

    def _gather_channel(self, seq: int, method: str) -> list[Any]:
        """``gather`` for a channel call: replies in rank order, the same failure rules."""
        import time
        from multiprocessing.connection import wait

        from armor_core.engine.channel import recv

        results: dict[int, Any] = {}
        failed: tuple[int, tuple[BaseException, str]] | None = None  # the first rank to raise: its error and traceback
        deadline: float | None = None
        for rank, (ok, value) in self._early.pop(seq, {}).items():  # read while gathering a later call
            if ok:
                results[rank] = value
            elif failed is None:
                failed, deadline = (rank, value), time.monotonic() + FAILURE_GRACE_S
        pending = {
            conn: rank
            for rank, conn in enumerate(self.conns)
            if rank not in results and (failed is None or failed[0] != rank)
        }
        while pending:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = cast(list[Connection], wait(list(pending), timeout=timeout))  # wait returns what it was given
            if not ready:  # the grace after a failure is over: the others wait on the failed rank in a collective
                assert failed is not None  # a deadline is set only with a failure
                rank, (err, _) = failed
                raise self._stopped_after_failure(
                    rank, method, sorted(pending.values()), f"{type(err).__name__}: {err}"
                ) from err
            for conn in ready:
                rank = pending.pop(conn)
                try:
                    got, ok, value = recv(conn)
                except (EOFError, OSError):
                    self._raise_dead(rank, method)
                except Exception as e:  # read whole but would not unpickle here (a class the driver lacks)
                    got, ok, value = (
                        seq,
                        False,
                        (RuntimeError(f"its reply to {method} could not be unpickled in the driver: {e!r}"), ""),
                    )
                if got != seq:  # the reply to an earlier call, not gathered yet: kept for its result()
                    self._early.setdefault(got, {})[rank] = (ok, value)
                    pending[conn] = rank
                elif ok:
                    results[rank] = value
                elif failed is None:
                    failed, deadline = (rank, value), time.monotonic() + FAILURE_GRACE_S
        if failed is not None:
            rank, (err, trace) = failed
            err.add_note(f"raised in {self.describe(rank)} during {method}; the worker's traceback:\n{trace}")
            raise err
        return [results[r] for r in range(self.n)]

    def _raise_dead(self, rank: int, method: str) -> None:
        """A rank's channel closed under a call: ask Ray why (it knows how the process ended), stop the group, raise."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            ray.get(self.workers[rank].__ray_call__.remote(_answer), timeout=30)
            cause = "its channel closed but the process still answers Ray; it was stopped"
        except RayActorError as e:
            cause = death_cause(e)
        except GetTimeoutError:
            cause = "its channel closed and it stopped answering"
        raise self._stopped_after_death(rank, method, cause)

    def _stopped_after_death(self, rank: int, method: str, cause: str) -> WorkerDiedError:
        """Stop the group after ``rank`` died; the error to raise."""
        who = self.describe(rank)
        self.shutdown()
        return WorkerDiedError(
            f"{who} died during {method}: {cause}. The group's other {self.n - 1} worker(s) were stopped."
        )

    def _stopped_after_failure(self, rank: int, method: str, stuck: list[int], error: str) -> WorkerDiedError:
        """Stop the group after ``rank`` raised while ranks ``stuck`` still wait on it (in a collective); the error to
        raise."""
        who = self.describe(rank)
        self.shutdown()
        return WorkerDiedError(
            f"{who} failed during {method} while ranks {stuck} waited on it; the group was stopped. The error: {error}"
        )

    def _gather_ray(self, refs: list[ObjectRef], method: str) -> list[Any]:
        """``gather`` for calls sent through Ray."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        rank_of = {ref: r for r, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        pending = list(refs)
        while pending:
            # one rank alone: ray.get raises for a dead actor as soon as Ray knows, no wait needed
            done, pending = ray.wait(pending, num_returns=1) if len(pending) > 1 else (pending, [])
            for ref in done:
                try:
                    results[rank_of[ref]] = ray.get(ref)
                except RayActorError as e:
                    if getattr(e, "actor_init_failed", False):  # its constructor raised: that error is the story
                        self.shutdown()
                        last = [line for line in str(e).splitlines() if line.strip()][-1].strip()
                        raise WorkerDiedError(f"{self.describe(rank_of[ref])} failed to start: {last}") from e
                    raise self._stopped_after_death(rank_of[ref], method, death_cause(e)) from e
                except RayTaskError as e:
                    if pending:
                        _, stuck = ray.wait(pending, num_returns=len(pending), timeout=FAILURE_GRACE_S)
                        if stuck:  # the others wait on the failed rank in a collective: they never return
                            error = f"{type(e.cause).__name__ if e.cause is not None else 'RayTaskError'}: {e.cause}"
                            raise self._stopped_after_failure(
                                rank_of[ref], method, sorted(rank_of[s] for s in stuck), error
                            ) from e
                    raise
        return [results[r] for r in range(len(refs))]

    def dispatch(self, method: Callable[..., Any], data: DataProto, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` with each rank's share of ``data``; gather results in the original order."""
        return self.submit(method, data, *args, **kwargs).result()

    def submit(self, method: Callable[..., Any], data: DataProto, *args: Any, **kwargs: Any) -> Pending:
        """``dispatch`` without waiting (see ``submit_call``); ``.result()`` is what ``dispatch`` returns."""
        parts = shares(data, self.n)
        return self._send(
            self._name(method), [(data if self.n == 1 else data[idx], *args) for idx in parts], kwargs, [parts]
        )

    def submit_pair(
        self, method: Callable[..., Any], first: DataProto, second: DataProto, *args: Any, **kwargs: Any
    ) -> Pending:
        """``method(first_share, second_share, *args)`` on every rank, each DataProto split over the
        ranks on its own; the method returns a pair, and ``.result()`` merges each half as ``dispatch`` would."""
        parts = [shares(first, self.n), shares(second, self.n)]
        pick = lambda data, idx: data if self.n == 1 else data[idx]  # noqa: E731
        return self._send(
            self._name(method), [(pick(first, a), pick(second, b), *args) for a, b in zip(*parts)], kwargs, parts
        )

    def shutdown(self) -> None:
        """Stop every worker and free the placement group; safe to call twice."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for conn in self.conns:
            conn.close()
        self.conns = []
        for w in self.workers:
            ray.kill(w)
        self.workers = []
        if self.pg is not None:
            try:
                remove_placement_group(self.pg)
            except Exception:  # already removed, or the cluster is gone: nothing left to free
                pass
            self.pg = None


def declared_methods(api: type) -> list[str]:
    """The public methods ``api`` declares (its own and inherited, not ``object``'s): what a worker class must
    define to serve a group called through ``api``."""
    return [m for m in dir(api) if not m.startswith("_") and callable(getattr(api, m))]


def _answer(worker: Any) -> bool:
    """Run in a worker through Ray: it answers if its process is alive."""
    return True
