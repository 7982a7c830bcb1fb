"""HTTP requests bounded in total wall time, for code that asks a service (a reward server, a judge, a
remote sandbox).

urllib's ``timeout`` bounds each socket operation, not the request: a server that sends a byte every
0.8 s, or never stops sending, is never cut by it. ``within(seconds)`` gives an opener whose connections
are shut when the time is up, which ends whatever urllib is blocked in (connecting, a TLS handshake, the
status line, the headers, the body); ``expired`` then says that what was read may not be all of it::

    with within(5.0) as opener:
        with opener.open(urllib.request.Request(url, body, method="POST")) as answer:
            text = answer.read(limit)
        if opener.expired:
            ...  # no whole answer within 5 s

Leaving the ``with`` shuts whatever the request left open. A read the deadline cut raises what urllib
raises for a dropped connection (``OSError``, ``http.client.IncompleteRead``), or returns short.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import urllib.request
from typing import Any, Iterator

__all__ = ["Bounded", "within"]


class Bounded:
    """An opener whose sockets are shut down when ``expire`` is called (by the timer of ``within``, or once
    the request is done)."""

    def __init__(self) -> None:
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._opener = urllib.request.build_opener(_HTTPHandler(self), _HTTPSHandler(self))

    def open(self, request: urllib.request.Request, timeout: float | None = None) -> Any:
        """``urllib.request.urlopen(request)`` through this opener; ``timeout`` bounds each socket operation."""
        return self._opener.open(request, timeout=timeout)

    def watch(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.append(sock)
            if self.expired:
                _shut(sock)
        return sock

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            for sock in self._sockets:
                _shut(sock)


@contextlib.contextmanager
def within(seconds: float) -> Iterator[Bounded]:
    """A ``Bounded`` opener whose connections are shut ``seconds`` from now, and when the block ends."""
    bounded = Bounded()
    timer = threading.Timer(seconds, bounded.expire)
    timer.daemon = True
    timer.start()
    try:
        yield bounded
    finally:
        timer.cancel()
        bounded.expire()  # the connection is done with: nothing is left open, whatever happened


def _shut(sock: socket.socket) -> None:
    try:  # the plain socket's shutdown, on its descriptor: a TLS socket's own would drop its state under a reader
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed, or handed over to TLS (then the TLS socket is watched)


class _Watched:
    """An HTTP(S) connection whose sockets a ``Bounded`` can shut: the plain one as it connects (a TLS
    handshake is cut too), then the TLS one."""

    def __init__(self, *args: Any, bounded: Bounded, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[call-arg]
        self.bounded = bounded
        make = self._create_connection  # type: ignore[has-type]
        self._create_connection = lambda *a, **k: bounded.watch(make(*a, **k))

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self.bounded.watch(self.sock)  # type: ignore[attr-defined]


class _WatchedHTTP(_Watched, http.client.HTTPConnection):
    pass


class _WatchedHTTPS(_Watched, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, bounded: Bounded) -> None:
        super().__init__()
        self.bounded = bounded

    def http_open(self, req: urllib.request.Request) -> Any:
        # typeshed wants a connection factory protocol the stdlib's own HTTPConnection subclasses meet at run time
        return self.do_open(_WatchedHTTP, req, bounded=self.bounded)  # pyright: ignore[reportArgumentType]


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, bounded: Bounded) -> None:
        super().__init__()
        self.bounded = bounded

    def https_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(_WatchedHTTPS, req, context=self._context, bounded=self.bounded)  # type: ignore[attr-defined]
