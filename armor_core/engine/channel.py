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
random per-group key), sent at once (TCP_NODELAY).

Start-up cannot hang: the driver's connect and handshake each time out (``CONNECT_TIMEOUT_S``,
``HANDSHAKE_TIMEOUT_S``) with an error naming the address, and a worker drops a peer that does not
complete the handshake within ``PEER_HANDSHAKE_S`` (one that connects and says nothing, or holds
another key) and waits on for the driver. On a cluster that is all this machine the workers
listen on the loopback address only (``listen_host``), so nothing outside can reach the port. A message is a pickle
(cloudpickle, as Ray
pickles calls, so a function defined in a test or a notebook travels too; protocol 5) and its
out-of-band buffers, each sent as it is (a DataProto's large tensors are not copied into the
pickle). Replies carry their request's number: one read while the driver gathers a later call is
kept for its own ``result()``.

Errors: an exception a method raises comes back and is raised in the driver as itself, with the
worker's traceback as a note; a ``SystemExit`` (or another ``BaseException`` that is not an ``Exception``)
comes back as a ``CodeExitError`` naming the line that raised it, so that it cannot end the driver with
its exit code. A dead worker closes its socket; the group then asks Ray why it died
(see ``WorkerGroup``).
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import sys
import threading
import time
import traceback
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any

from ray import cloudpickle

from armor_core.errors import code_exit_error

__all__ = ["connect", "encode", "listen_host", "open_channel", "recv", "send", "write"]

# the driver connects as soon as every worker listens: seconds, even across nodes
CONNECT_TIMEOUT_S = 30.0
HANDSHAKE_TIMEOUT_S = 30.0
# a worker's patience with one peer; below the driver's, so that the driver, waiting behind a silent
# peer that connected first, still completes its handshake after the worker has dropped that peer
PEER_HANDSHAKE_S = 10.0
# a worker whose driver has not connected by then stops listening (the driver has failed or gone)
ACCEPT_TIMEOUT_S = 600.0
LOOPBACK = "127.0.0.1"


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
    return pickle.loads(memoryview(first)[4 + 8 * count :], buffers=buffers)


def listen_host() -> str | None:
    """Run in the driver: the loopback address when every node of the Ray cluster is this machine,
    else None (each worker then listens on its node's IP, which the driver reaches over the network)."""
    import ray

    here = ray.util.get_node_ip_address()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    return LOOPBACK if nodes and all(n.get("NodeManagerAddress") == here for n in nodes) else None


def open_channel(worker: Any, authkey: bytes, host: str | None = None) -> tuple[str, int]:
    """Run inside a worker (``actor.__ray_call__.remote(open_channel, key, host)``): listen on
    ``host`` (default: this node's IP), serve ``worker``'s methods to the one driver that connects,
    return the address."""
    import ray

    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind((host or ray.util.get_node_ip_address(), 0))
    server.listen(8)
    device = _cuda_device()
    threading.Thread(target=_serve, args=(worker, server, authkey, device), name="armor-channel", daemon=True).start()
    return server.getsockname()[:2]


def connect(address: tuple[str, int], authkey: bytes) -> Connection:
    """The driver's end of a worker's channel; ``OSError`` (``TimeoutError`` past the limits) with
    the address and what failed if the worker cannot be reached or does not complete the handshake."""
    where = f"{address[0]}:{address[1]}"
    try:
        sock = socket.create_connection(address, timeout=CONNECT_TIMEOUT_S)
    except TimeoutError:
        raise TimeoutError(f"connecting to {where} timed out after {CONNECT_TIMEOUT_S:g} s") from None
    try:
        return _handshake(sock, authkey, HANDSHAKE_TIMEOUT_S, worker_side=False)
    except AuthenticationError as e:
        raise ConnectionError(
            f"{where} failed the channel's authentication ({e}): not the worker that opened it"
        ) from None
    except EOFError:
        raise ConnectionError(f"{where} closed the connection during the handshake") from None
    except (BlockingIOError, TimeoutError):
        raise TimeoutError(
            f"{where} accepted the connection but did not complete the handshake within {HANDSHAKE_TIMEOUT_S:g} s"
        ) from None


def _handshake(sock: socket.socket, authkey: bytes, timeout_s: float, worker_side: bool) -> Connection:
    """Both ends prove they hold ``authkey`` (multiprocessing's HMAC challenges, as its Listener and
    Client run them), each read and write bounded by ``timeout_s``; the connection, with no timeout."""
    sock.settimeout(None)  # a blocking descriptor: Connection reads it with os.read
    _io_timeout(sock, timeout_s)  # the kernel ends a read or write that waits longer (EAGAIN)
    conn = Connection(sock.detach())
    try:
        if worker_side:
            deliver_challenge(conn, authkey)
            answer_challenge(conn, authkey)
        else:
            answer_challenge(conn, authkey)
            deliver_challenge(conn, authkey)
        with socket.socket(
            fileno=os.dup(conn.fileno())
        ) as dup:  # options belong to the socket, shared by both descriptors
            _io_timeout(dup, 0)
    except BaseException:
        conn.close()
        raise
    return _no_delay(conn)


def _io_timeout(sock: socket.socket, seconds: float) -> None:
    """SO_RCVTIMEO and SO_SNDTIMEO; 0 = wait for ever."""
    tv = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _accept(server: socket.socket, authkey: bytes, timeout_s: float) -> Connection:
    """The first peer to complete the handshake; ``TimeoutError`` if none does within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        server.settimeout(max(0.001, deadline - time.monotonic()))
        sock, _ = server.accept()  # TimeoutError past the deadline
        try:
            return _handshake(sock, authkey, PEER_HANDSHAKE_S, worker_side=True)
        except (OSError, EOFError, AuthenticationError):
            continue  # silent, gone, or holding another key: not our driver; keep listening


def _no_delay(conn: Connection) -> Connection:
    """Send each write at once. With Nagle's algorithm a message's second write (a buffer after
    its header) waited for the peer's delayed ACK: 4-5 ms on one call in six, measured."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:  # a duplicate descriptor: the option is the socket's
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _cuda_device() -> int | None:
    """The opening thread's current CUDA device: a new thread would start on device 0."""
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


def _serve(worker: Any, server: socket.socket, authkey: bytes, device: int | None) -> None:
    if device is not None:
        import torch

        torch.cuda.set_device(device)
    try:
        conn = _accept(server, authkey, ACCEPT_TIMEOUT_S)
    except TimeoutError:
        print(f"armor channel: no driver connected within {ACCEPT_TIMEOUT_S:.0f} s; stopped listening", file=sys.stderr)
        return
    finally:
        server.close()
    with conn:
        while True:
            try:
                seq, method, args, kwargs = recv(conn)
            except Exception:  # the driver closed the channel, went away, or broke off mid-message:
                return  # closing our end tells it this worker can take no more calls
            try:
                reply = (seq, True, getattr(worker, method)(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - every failure goes back to the driver
                if not isinstance(e, Exception):  # SystemExit from code the method ran: in the driver it would end
                    e = code_exit_error(e, f"the worker's {method}")  # the run with its code, 0 for sys.exit()
                reply = (seq, False, (_portable(e), traceback.format_exc()))
            try:
                send(conn, reply)
            except (EOFError, OSError):
                return
            except Exception as e:  # the result or the exception would not pickle: say what it was
                send(
                    conn,
                    (
                        seq,
                        False,
                        (
                            RuntimeError(f"{method} returned or raised something that cannot be pickled: {e!r}"),
                            traceback.format_exc(),
                        ),
                    ),
                )
