"""The cluster checks that replace a wait without end by a one-line error: an address nobody
answers at, and workers the cluster's nodes could never hold."""

from __future__ import annotations

import socket
import time

import pytest

from armor_core.engine.cluster import ClusterError, check_address, check_capacity


def _closed_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_address_nobody_answers_at_fails_after_the_connect_timeout():
    port = _closed_port()
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=rf"engine.address=127.0.0.1:{port}: no Ray cluster answered .* within 1 s"):
        check_address(f"127.0.0.1:{port}", 1.0)
    assert time.monotonic() - t0 < 3.0


@pytest.fixture
def server():
    """A listener on a free local port; ``answer`` is what it sends each connection after the client's first bytes."""
    import threading

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    state = {"answer": None}

    def serve():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            conn.recv(64)
            if state["answer"] is not None:
                conn.sendall(state["answer"])
            time.sleep(5)  # held open, silent
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield sock.getsockname()[1], state
    sock.close()


def test_a_grpc_server_passes_and_a_port_that_is_not_one_is_named(server):
    port, state = server
    state["answer"] = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # an HTTP/2 SETTINGS frame, as every gRPC server sends first
    check_address(f"127.0.0.1:{port}", 5.0)
    check_address(f"ray://127.0.0.1:{port}", 5.0)
    state["answer"] = b"HTTP/1.1 400 Bad Request\r\n\r\n"
    with pytest.raises(ClusterError, match=rf"something accepts connections at 127.0.0.1:{port}, but it is not a Ray"):
        check_address(f"127.0.0.1:{port}", 2.0)
    state["answer"] = None  # accepts and never answers, as Ray's client would wait on without end
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"no gRPC handshake within 1 s"):
        check_address(f"127.0.0.1:{port}", 1.0)
    assert time.monotonic() - t0 < 3.0


def test_a_malformed_address_is_named_and_auto_is_left_to_ray():
    with pytest.raises(ClusterError, match=r"engine.address='10.0.0.5': expected 'auto' or host:port"):
        check_address("10.0.0.5", 1.0)
    check_address("auto", 1.0)  # left to Ray, which finds a local cluster or fails at once


@pytest.mark.parametrize(
    "nodes, groups, cpus, gpus, match",
    [
        ([{"CPU": 1.0}], {"actor": 2}, 1.0, 0.0, r"need 2 CPUs \(2 actor workers x 1\), but the Ray cluster has 1"),
        ([{"CPU": 2.0}], {"actor": 1, "critic": 1}, 2.0, 0.0, r"need 4 CPUs \(1 actor \+ 1 critic workers x 2\)"),
        ([{"CPU": 8.0}], {"actor": 1}, 1.0, 1.0, r"need 1 GPUs .* has 0; .*engine.gpus_per_worker"),
        ([{"CPU": 2.0}, {"CPU": 2.0}], {"actor": 1}, 3.0, 0.0, r"needs 3 CPUs and 0 GPUs on one node.* has 2 CPUs"),
    ],
)
def test_workers_the_cluster_cannot_hold_are_refused_at_once(nodes, groups, cpus, gpus, match):
    with pytest.raises(ClusterError, match=match):
        check_capacity(nodes, groups, cpus, gpus)


def test_workers_that_fit_pass():
    check_capacity([{"CPU": 2.0}, {"CPU": 2.0, "GPU": 1.0}], {"actor": 2}, 2.0, 0.0)
    check_capacity([{"CPU": 2.0}, {"CPU": 2.0, "GPU": 1.0}], {"actor": 1}, 2.0, 1.0)
