"""A direct socket from the driver to each worker, for the calls a run makes every step.

Between steps, when the threads that carry a call have gone idle, a Ray actor call's round trip
took 2.6 ms empty and 4.6 ms with a 128-row DataProto each way on a 2-core CPU machine; this
channel took 0.8 and 2.0 ms (``benchmarks/dataproto_transfer.py --rows 128 --seq 24 --idle-ms 65``).
A Ray call's request and reply each hop through several threads that must be woken; on a 0.1 s
step that was most of the engine's overhead.

Ray still places, starts, watches and stops the workers. Once a group is up, ``open_channel``
runs inside each actor (through Ray's ``__ray_call__``) and starts a thread that accepts one
connection from the driver and then runs the requests sent on it, one at a time, in order: the
same guarantee a Ray actor gives. Every call goes through the channel from then on, so the
worker's methods never run on two threads at once.

Wire format: ``multiprocessing.connection`` messages (length-framed, HMAC-authenticated with a
random per-group key), sent at once (TCP_NODELAY). A message is a pickle (cloudpickle, as Ray
pickles calls, so a function defined in a test or a notebook travels too; protocol 5) and its
out-of-band buffers, each sent as it is (a DataProto's large tensors are not copied into the
pickle). Replies carry their request's number: one read while the driver gathers a later call is
kept for its own ``result()``.

Errors: an exception a method raises comes back and is raised in the driver as itself, with the
worker's traceback as a note. A dead worker closes its socket; the group then asks Ray why it died
(see ``WorkerGroup``).
"""

from __future__ import annotations

import os
import pickle
import struct
import threading
import traceback
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from ray import cloudpickle

__all__ = ["connect", "encode", "open_channel", "recv", "send", "write"]


def encode(obj: Any) -> tuple[bytes, list[memoryview]]:
    """``obj`` as one message: a header (buffer count and sizes) with the pickle, and the
    out-of-band buffers (a DataProto's large tensors), to be written as they are."""
    buffers: list[pickle.PickleBuffer] = []
    head = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    return struct.pack(f"<I{len(views)}Q", len(views), *(v.nbytes for v in views)) + head, views


def write(conn: Connection, message: tuple[bytes, list[memoryview]]) -> None:
    first, views = message
    conn.send_bytes(first)
    for v in views:
        conn.send_bytes(v)


def send(conn: Connection, obj: Any) -> None:
    write(conn, encode(obj))


def recv(conn: Connection) -> Any:
    """A message ``send`` wrote, read whole before it is unpickled (so the stream stays in step)."""
    first = conn.recv_bytes()
    (count,) = struct.unpack_from("<I", first)
    sizes = struct.unpack_from(f"<{count}Q", first, 4)
    buffers = []
    for n in sizes:
        buf = bytearray(n)  # writable: tensors built on it may be written to in place
        conn.recv_bytes_into(buf)
        buffers.append(buf)
    return pickle.loads(memoryview(first)[4 + 8 * count:], buffers=buffers)


def open_channel(worker: Any, authkey: bytes) -> tuple[str, int]:
    """Run inside a worker (``actor.__ray_call__.remote(open_channel, key)``): listen on this
    node's IP, serve ``worker``'s methods to the one driver that connects, return the address."""
    import ray

    listener = Listener((ray.util.get_node_ip_address(), 0), authkey=authkey)
    device = _cuda_device()
    threading.Thread(target=_serve, args=(worker, listener, device), name="armor-channel", daemon=True).start()
    return listener.address


def connect(address: tuple[str, int], authkey: bytes) -> Connection:
    return _no_delay(Client(address, authkey=authkey))


def _no_delay(conn: Connection) -> Connection:
    """Send each write at once. With Nagle's algorithm a message's second write (a buffer after
    its header) waited for the peer's delayed ACK: 4-5 ms on one call in six, measured."""
    import socket

    with socket.socket(fileno=os.dup(conn.fileno())) as sock:  # a duplicate descriptor: the option is the socket's
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _cuda_device() -> int | None:
    """The opening thread's current CUDA device: a new thread would start on device 0."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return None


def _portable(e: BaseException) -> BaseException:
    """``e`` if it survives pickling (the driver raises it as itself), else a RuntimeError naming it."""
    try:
        pickle.loads(cloudpickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def _serve(worker: Any, listener: Listener, device: int | None) -> None:
    if device is not None:
        import torch

        torch.cuda.set_device(device)
    try:
        conn = _no_delay(listener.accept())
    finally:
        listener.close()
    with conn:
        while True:
            try:
                seq, method, args, kwargs = recv(conn)
            except Exception:  # the driver closed the channel, went away, or broke off mid-message:
                return  # closing our end tells it this worker can take no more calls
            try:
                reply = (seq, True, getattr(worker, method)(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - every failure goes back to the driver
                reply = (seq, False, (_portable(e), traceback.format_exc()))
            try:
                send(conn, reply)
            except (EOFError, OSError):
                return
            except Exception as e:  # the result or the exception would not pickle: say what it was
                send(conn, (seq, False, (RuntimeError(f"{method} returned or raised something that cannot be pickled: {e!r}"), traceback.format_exc())))
