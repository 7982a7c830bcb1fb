"""Worker-group dispatch: balanced splits by token count, same row count per rank."""

from __future__ import annotations

import numpy as np
import pytest

from armor_core.engine import balanced_split


def test_split_balances_tokens_and_keeps_row_counts_equal():
    tokens = np.array([100, 1, 1, 1, 50, 50, 2, 95])
    parts = balanced_split(tokens, 2)
    assert sorted(np.concatenate(parts).tolist()) == list(range(8))
    assert [len(p) for p in parts] == [4, 4]
    loads = sorted(int(tokens[p].sum()) for p in parts)
    # worked by hand: the rank holding the 100-token row needs three more rows; taking 50 gives
    # at least 100+50+1+1 = 152, leaving 148; without 50 (and 95) it holds at most 104. So 152/148
    # is optimal, where splitting by position would give 103/197.
    assert loads == [148, 152]


def test_split_refuses_uneven_rows():
    with pytest.raises(ValueError, match="cannot split 5 rows evenly over 2 workers"):
        balanced_split(np.ones(5), 2)


# -- the direct channel's start-up: bounded waits, clear errors --------------------------------


def _worker_end(monkeypatch, key, peer_handshake_s=0.3):
    """A worker's listener on loopback, accepting in a thread as ``open_channel`` does; the result holder."""
    import socket
    import threading

    from armor_core.engine import channel

    monkeypatch.setattr(channel, "PEER_HANDSHAKE_S", peer_handshake_s)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    got = {}
    thread = threading.Thread(target=lambda: got.update(conn=channel._accept(server, key, 20.0)), daemon=True)
    thread.start()
    return server.getsockname(), thread, got


def test_a_silent_peer_that_connects_first_does_not_keep_the_driver_out(monkeypatch):
    import socket
    import time

    from armor_core.engine import channel

    key = b"k" * 32
    address, thread, got = _worker_end(monkeypatch, key)
    silent = socket.create_connection(address)  # connects, never answers the challenge
    stranger = socket.create_connection(address)
    t0 = time.monotonic()
    conn = channel.connect(address, key)
    thread.join(10)
    assert time.monotonic() - t0 < 5  # one peer budget (0.3 s) per stranger, not for ever
    channel.send(conn, ("hello", [1, 2]))
    assert channel.recv(got["conn"]) == ("hello", [1, 2])
    for c in (conn, got["conn"], silent, stranger):
        c.close()


def test_a_wrong_key_is_refused_and_the_worker_keeps_listening(monkeypatch):
    from armor_core.engine import channel

    address, thread, got = _worker_end(monkeypatch, b"right" * 8)
    with pytest.raises(ConnectionError, match=rf"127.0.0.1:{address[1]} failed the channel's authentication"):
        channel.connect(address, b"wrong" * 8)
    conn = channel.connect(address, b"right" * 8)
    thread.join(10)
    assert "conn" in got
    conn.close()
    got["conn"].close()


def test_a_listener_that_never_answers_times_out_with_the_address(monkeypatch):
    import socket
    import time

    from armor_core.engine import channel

    monkeypatch.setattr(channel, "HANDSHAKE_TIMEOUT_S", 0.5)
    mute = socket.socket()  # accepts (the kernel completes the connection) but never sends the challenge
    mute.bind(("127.0.0.1", 0))
    mute.listen(1)
    t0 = time.monotonic()
    with pytest.raises(
        TimeoutError,
        match=rf"127.0.0.1:{mute.getsockname()[1]} accepted the connection but did not complete the handshake within 0.5 s",
    ):
        channel.connect(mute.getsockname(), b"k" * 32)
    assert time.monotonic() - t0 < 5
    mute.close()


def test_connecting_is_bounded_too(monkeypatch):

    from armor_core.engine import channel

    calls = []

    def unreachable(address, timeout=None):  # a dropped SYN: only the timeout ends it
        calls.append(timeout)
        raise TimeoutError("timed out")

    monkeypatch.setattr(channel.socket, "create_connection", unreachable)
    with pytest.raises(TimeoutError, match=r"connecting to 10.1.2.3:4567 timed out after 30 s"):
        channel.connect(("10.1.2.3", 4567), b"k" * 32)
    assert calls == [channel.CONNECT_TIMEOUT_S]


@pytest.mark.slow
def test_the_channel_listens_on_loopback_on_a_one_machine_cluster(ray_cluster):
    from armor_core.engine.channel import listen_host

    assert listen_host() == "127.0.0.1"


def test_a_worker_method_that_exits_comes_back_as_an_error_not_as_systemexit():
    # raised in the driver as itself, a SystemExit(0) from a worker ended `armor run` with exit code 0
    import socket
    import threading

    from armor_core.engine import channel
    from armor_core.errors import CodeExitError

    class Worker:
        def generate(self):
            raise SystemExit(0)  # a plugin's sys.exit(0)

        def echo(self, x):
            return x

    key = b"k" * 32
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    threading.Thread(target=channel._serve, args=(Worker(), server, key, None), daemon=True).start()
    conn = channel.connect(server.getsockname(), key)
    channel.send(conn, (1, "generate", (), {}))
    seq, ok, (err, trace) = channel.recv(conn)
    assert (seq, ok) == (1, False) and isinstance(err, CodeExitError)
    assert "the worker's generate: code it ran raised SystemExit(0) at" in str(err) and "in generate" in str(err)
    channel.send(conn, (2, "echo", (5,), {}))
    assert channel.recv(conn) == (2, True, 5)  # the worker still serves
    conn.close()
