"""Reward checks in worker processes, under a hard time limit: the pool behind ``RewardManager``.

Verifiers can hang (sympy on ``2^{10^{10}}``, pathological LaTeX). ``signal.alarm`` works only in
the main thread of the main interpreter (not in a trainer thread or a Ray actor's call), so the
limit is enforced from outside: a ``Pool`` runs each check in one of its worker processes and
kills and replaces a worker whose check exceeds ``timeout_s``; the row gets a ``timeout`` outcome.
A worker that dies (segfault, out-of-memory kill) gives its row an error outcome and is replaced.

Workers are started with ``spawn`` (safe from a threaded driver, unlike ``fork``; a script that
builds a RewardManager must guard its entry point with ``if __name__ == "__main__":``, since spawned
workers import ``__main__`` again). Each domain reaches them pickled by reference, i.e. imported by
module and name, as a plugin manager would. The clock of a check starts once the worker has
imported the domain and run its ``RewardDomain.warmup()``, if it has one (the math domain imports sympy
there, ~1 s): otherwise a limit shorter than that import would kill every fresh worker on its first
row, forever.

``evaluate`` (one check, its exceptions turned into an outcome) lives here because both sides run
it: a worker for each job, and the manager in its own process for an inline domain.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import numbers
import pickle
import signal
import time
import traceback
import weakref
from collections import deque
from multiprocessing.connection import wait as wait_for_connections
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Sequence

if TYPE_CHECKING:
    from armor_core.interfaces import RewardDomain

__all__ = ["FLOAT32_MAX", "Outcome", "Pool", "evaluate", "evaluate_batch"]
_RESERVED_SUBS = ("score", "failures")
_LOAD_TIMEOUT_S = 120.0  # a fresh worker importing a domain's module (sympy: ~1 s) is not the check
_START_TIMEOUT_S = 120.0
FLOAT32_MAX = 3.4028234663852886e38  # the largest finite float32: a score beyond it is inf in training


class Outcome(NamedTuple):
    status: str  # "ok" | "error" | "timeout"
    score: float = 0.0
    subs: dict | None = None
    kind: str = ""
    message: str = ""
    trace: str = ""


def _finite(value: Any, what: str) -> float:
    """``value`` as a float when it is a finite number within float32's range. A str is refused although float()
    reads it: a domain returning "1" (or "0.5 partial") has a bug, and taking its text as a score would hide it.
    Scores are trained in float32, where 1e39 is inf: such a score would pass here as finite and then make every
    step's advantages NaN."""
    if isinstance(value, (str, bytes)) or not isinstance(value, numbers.Real) and not hasattr(value, "__float__"):
        raise TypeError(f"the domain returned the {what} {value!r}, a {type(value).__name__}; return a number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"the domain returned a non-finite {what} {number}")
    if abs(number) > FLOAT32_MAX:
        raise ValueError(
            f"the domain returned the {what} {number:g}, outside the float32 range (+-{FLOAT32_MAX:.4g}) scores are "
            "trained in; return a score of a sensible size"
        )
    return number


def _outcome(result: Any) -> Outcome:
    """A domain's result (a RewardResult, or a number its ``__call__`` wrapped) checked and made an Outcome."""
    score = _finite(result.score, "score")
    subs = {}
    for key, value in result.sub_scores.items():
        if key in _RESERVED_SUBS:
            raise ValueError(f"sub-score name {key!r} is reserved (ARMOR logs reward/<domain>/{key} itself); rename it")
        subs[str(key)] = _finite(value, f"sub-score {key!r}")
    return Outcome("ok", score, subs)


def _failed(e: BaseException) -> Outcome:
    return Outcome(
        "error",
        kind=type(e).__name__,
        message=f"{type(e).__name__}: {e}"[:1000],
        trace=traceback.format_exc()[-3000:],
    )


def evaluate(domain: RewardDomain, prompt: str, response: str, ground_truth: Any, extra: Mapping[str, Any]) -> Outcome:
    try:
        return _outcome(domain(prompt, response, ground_truth, extra))
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # a domain calling sys.exit() fails its row; it does not end the run
        return _failed(e)


def evaluate_batch(
    domain: RewardDomain,
    prompts: Sequence[str],
    responses: Sequence[str],
    ground_truths: Sequence[Any],
    extras: Sequence[Mapping[str, Any]],
) -> list[Outcome] | Outcome:
    """Every row through ``domain.batch_fn`` in one call: an Outcome per row, or one for all when the call failed.
    The batch function may put an exception in a row's place: that row fails with it."""
    from armor_core.interfaces import RewardResult

    assert domain.batch_fn is not None  # called for a batched domain only
    try:
        results = list(domain.batch_fn(list(prompts), list(responses), list(ground_truths), [dict(e) for e in extras]))
        if len(results) != len(prompts):
            raise ValueError(f"the batch function returned {len(results)} results for {len(prompts)} rows")
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        return _failed(e)
    outcomes = []
    for result in results:
        if isinstance(result, Exception):  # a row the batch function could not score, and why
            outcomes.append(Outcome("error", kind=type(result).__name__, message=f"{type(result).__name__}: {result}"))
            continue
        try:
            outcomes.append(_outcome(result if isinstance(result, RewardResult) else RewardResult(score=result)))
        except Exception as e:
            outcomes.append(_failed(e))
    return outcomes


def _worker_main(conn: Any) -> None:
    """A worker: receives ``(job, pickled domain, args, batch)``, answers ``("done", job, outcome)`` (with
    ``batch``, the outcome of each row, or one for all)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    domains: dict[bytes, RewardDomain] = {}
    conn.send(("ready",))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        job, spec, args, batch = msg
        domain = domains.get(spec)
        if domain is None:
            try:
                domain = domains[spec] = pickle.loads(spec)
                if domain.warmup is not None:
                    domain.warmup()
            except BaseException as e:  # SIGINT is ignored here; a SystemExit is the domain's failure
                conn.send(
                    (
                        "done",
                        job,
                        Outcome(
                            "error", kind=type(e).__name__, message=f"cannot import the domain in a reward worker: {e}"
                        ),
                    )
                )
                continue
            conn.send(("loaded", job))
        conn.send(("done", job, evaluate_batch(domain, *args) if batch else evaluate(domain, *args)))


class _Worker:
    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="armor-reward-worker")
        self.proc.start()
        child.close()
        self.started = time.monotonic()
        self.ready = False
        self.job: int | None = None
        self.spec: bytes | None = None
        self.deadline = math.inf
        self.loaded: set[bytes] = set()

    def stop(self, kill: bool) -> None:
        if not kill:
            try:
                self.conn.send(None)
                self.proc.join(1.0)
            except (OSError, ValueError):
                pass
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5.0)
        self.conn.close()


def _stop_all(workers: list[_Worker]) -> None:
    for w in workers:
        w.stop(kill=False)
    workers.clear()


class Pool:
    """``size`` spawned processes; one check at a time each; a check past ``timeout_s`` kills its worker."""

    def __init__(self, size: int, timeout_s: float) -> None:
        self._ctx = mp.get_context("spawn")
        self.timeout_s = timeout_s
        self._workers = [_Worker(self._ctx) for _ in range(size)]
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)

    def _replace(self, w: _Worker) -> None:
        w.stop(kill=True)
        self._workers[self._workers.index(w)] = _Worker(self._ctx)

    def run(self, jobs: Sequence[tuple[bytes, tuple, bool]]) -> list[Outcome | list[Outcome]]:
        """Each job is ``(pickled domain, args, batch)``; its result is an Outcome, or with ``batch`` an Outcome
        per row (or one for all rows: the call failed, timed out, or its worker died)."""
        results: list[Outcome | None] = [None] * len(jobs)
        queue, remaining = deque(range(len(jobs))), len(jobs)
        while remaining:
            now = time.monotonic()
            self._hand_out(queue, jobs, now)
            waiting = [w for w in self._workers if w.job is not None or not w.ready]
            deadline = min([w.deadline for w in waiting if w.job is not None] + [now + 1.0])
            by_conn = {w.conn: w for w in waiting}
            for conn in wait_for_connections(list(by_conn), max(0.0, deadline - now)):
                w = by_conn[conn]
                try:
                    msg = w.conn.recv()
                except (EOFError, OSError):  # the worker died: segfault, out-of-memory kill
                    w.proc.join(5.0)  # reap it, for its exit code
                    if not w.ready:
                        raise RuntimeError(
                            f"a reward worker process exited at start (exit code {w.proc.exitcode}); its error is "
                            "printed above. Workers are spawned and import the driver's __main__ module again: "
                            "guard a script with `if __name__ == '__main__':`"
                        ) from None
                    if w.job is not None:
                        results[w.job] = Outcome(
                            "error",
                            kind="WorkerDied",
                            message=f"the reward worker process died (exit code {w.proc.exitcode}) on this row",
                        )
                        remaining -= 1
                    self._replace(w)
                    continue
                if msg[0] == "ready":
                    w.ready = True
                elif msg[0] == "loaded":
                    w.loaded.add(w.spec)  # type: ignore[arg-type]
                    w.deadline = time.monotonic() + self.timeout_s
                elif msg[0] == "done" and w.job is not None and msg[1] == w.job:
                    results[w.job], w.job = msg[2], None
                    remaining -= 1
            now = time.monotonic()
            for w in [w for w in self._workers if w.job is not None and w.deadline < now]:
                assert w.job is not None
                results[w.job] = Outcome(
                    "timeout",
                    kind="timeout",
                    message=f"no result within reward.timeout_s={self.timeout_s:g} s; the worker was killed",
                )
                remaining -= 1
                self._replace(w)
        return results  # type: ignore[return-value]

    def _hand_out(self, queue: deque, jobs: Sequence[tuple[bytes, tuple, bool]], now: float) -> None:
        """The next jobs of ``queue`` to the idle workers that are ready, each with its deadline (longer while its
        domain has not been loaded in that worker yet)."""
        for w in list(self._workers):
            if w.ready and w.job is None and queue:
                job = queue.popleft()
                try:
                    w.conn.send((job, *jobs[job]))
                except (BrokenPipeError, ConnectionResetError):  # died while idle: retry the row on its replacement
                    queue.appendleft(job)
                    self._replace(w)
                    continue
                w.job, w.spec = job, jobs[job][0]
                w.deadline = now + (self.timeout_s if w.spec in w.loaded else max(_LOAD_TIMEOUT_S, self.timeout_s))
            elif not w.ready and now - w.started > _START_TIMEOUT_S:
                raise RuntimeError(f"a reward worker process did not start within {_START_TIMEOUT_S:.0f} s")

    def close(self) -> None:
        self._finalizer()
