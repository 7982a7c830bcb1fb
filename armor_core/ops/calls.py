"""Calls into code ARMOR does not control (a tool, an environment's step): bounded in wall time and
kept apart from whatever the code raises.

``in_thread(fn, *args, **kwargs)`` runs ``fn`` on a daemon thread of its own and returns a future, on the
running event loop, of its ``Outcome`` (a coroutine ``fn`` returns is run to its end on an event loop of
that thread's own). ``guarded(awaitable)`` awaits on the running loop and gives its ``Outcome``. Neither
raises what the code raised: the ``Outcome`` holds the value or the exception, ``SystemExit`` included.
asyncio lets ``SystemExit`` escape the event loop, so a tool that called ``sys.exit`` (argparse on bad
arguments does) would otherwise end the process, with exit code 0.

Bound a call with ``asyncio.wait_for(in_thread(...), timeout)``. Python cannot kill a thread: one that
runs past its caller's timeout is abandoned and runs on until it returns. It holds no slot of a shared
pool (a later call never queues behind a hung one), and it is a daemon, so neither the event loop's
close nor the process's exit waits for it. Code that may hang holding memory or a child process should
run in a process of its own.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

__all__ = ["Outcome", "describe", "guarded", "in_thread"]


@dataclass(frozen=True)
class Outcome:
    """What a call gave: its ``value``, or the ``error`` it raised (then ``value`` is None)."""

    value: Any = None
    error: BaseException | None = None


def describe(error: BaseException) -> str:
    """``"RuntimeError: disk on fire"``, or ``"SystemExit: 2"``; the type alone when the message is empty."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def in_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> asyncio.Future[Outcome]:
    """``fn(*args, **kwargs)`` on a daemon thread of its own (see the module docstring); call it from a
    coroutine. The future is resolved with the call's ``Outcome``, unless the caller has stopped waiting."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Outcome] = loop.create_future()

    def settle(outcome: Outcome) -> None:
        if not future.done():  # done: cancelled, the caller's timeout passed
            future.set_result(outcome)

    def run() -> None:
        try:
            value = fn(*args, **kwargs)
            if inspect.iscoroutine(value):  # an async fn: run it here, where it cannot block the caller's loop
                value = asyncio.run(value)
            outcome = Outcome(value)
        except BaseException as e:  # noqa: BLE001 - on this thread, whatever was raised is the code's own
            outcome = Outcome(error=e)
        try:
            loop.call_soon_threadsafe(settle, outcome)
        except RuntimeError:  # the caller's loop has closed: nobody waits for this call any more
            pass

    name = getattr(fn, "__name__", type(fn).__name__)
    threading.Thread(target=run, name=f"armor-call-{name}", daemon=True).start()
    return future


async def guarded(awaitable: Awaitable[Any]) -> Outcome:
    """``awaitable``'s ``Outcome`` on the running loop. A ``KeyboardInterrupt`` (the user's Ctrl-C, on this
    thread) and a cancellation of the caller still propagate; every other exception is the outcome."""
    try:
        return Outcome(await awaitable)
    except (KeyboardInterrupt, asyncio.CancelledError):
        raise
    except BaseException as e:  # noqa: BLE001 - SystemExit too: asyncio would let it end the process
        return Outcome(error=e)
