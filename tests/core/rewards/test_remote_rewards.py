"""A reward service over HTTP (``reward.remote``) against a hostile stand-in on the loopback address: slow,
dropping connections, answering 5xx, 4xx and garbage. Good answers score; bad ones fail their rows within
the time the settings allow, never hang, and a dead service stops a watched run."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from armor_core.config.schema import ConfigError, RewardConfig, load_config
from armor_core.plugins import PluginManager
from armor_core.rewards.checks import RewardFailureError
from armor_core.rewards.manager import RewardManager


class Service(BaseHTTPRequestHandler):
    behaviour = "ok"
    bodies: list = []
    in_flight = 0
    most_in_flight = 0
    lock = threading.Lock()
    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802 - the http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        with cls.lock:
            cls.bodies.append(body)
            cls.in_flight += 1
            cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
            calls = len(cls.bodies)
        try:
            self._answer(body, calls)
        finally:
            with cls.lock:
                cls.in_flight -= 1

    def _answer(self, body, calls):
        behaviour = self.behaviour
        if behaviour == "flaky":  # the first two requests are dropped, then it works
            behaviour = "drop" if calls <= 2 else "ok"
        if behaviour == "slow":
            time.sleep(2.0)
        if behaviour == "drop":
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if behaviour in ("500", "400"):
            return self._send(int(behaviour), b"model server says no")
        if behaviour == "garbage":
            return self._send(200, b"<html>not json</html>")
        rewards = [float(q.endswith(str(label))) for q, label in zip(body["query"], body["labels"])]
        if behaviour == "short":
            rewards = rewards[:-1]
        if behaviour == "bad_row":
            rewards[0] = "high"
        if behaviour == "huge":  # finite in JSON, inf in the float32 scores are trained in
            rewards[0], rewards[1] = 1e39, -1e39
        time.sleep(0.2)  # long enough for concurrent requests to overlap
        lengths = [float(len(r)) for r in body["responses"]]
        answer = {"rewards": rewards, "extra_logs": {"length": lengths, "note": "ignored: not per row"}}
        self._send(200, json.dumps(answer).encode())

    def _send(self, status, payload):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a client that gave up on a slow answer: its broken pipe is the point of the test


@pytest.fixture
def url():
    Service.bodies, Service.in_flight, Service.most_in_flight, Service.behaviour = [], 0, 0, "ok"
    server = QuietServer(("127.0.0.1", 0), Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/get_reward"
    server.shutdown()
    server.server_close()


def _manager(url, watch=False, **remote):
    entry = {"url": url, "data_sources": ["chat"], "timeout_s": 1.0, "retries": 2, "backoff_s": 0.05, **remote}
    return RewardManager(RewardConfig(remote=entry, failure_score=-1.0), PluginManager(), watch_failures=watch)


def _score(manager, n=4):
    responses = [f"answer {i}" for i in range(n)]
    labels = [str(i) if i % 2 == 0 else "x" for i in range(n)]
    return manager.score(["Q: "] * n, responses, ["chat"] * n, labels)


def test_the_service_scores_in_openrlhfs_shapes_batched_and_at_most_max_concurrency_at_once(url):
    with _manager(url, batch_size=2, max_concurrency=2) as manager:
        batch = _score(manager, n=10)
    assert batch.scores.tolist() == [1.0, 0.0] * 5
    assert batch.sub_scores["remote/length"].tolist() == [8.0] * 10  # extra_logs, per row
    assert "remote/note" not in batch.sub_scores
    assert len(Service.bodies) == 5 and Service.most_in_flight == 2
    first = next(b for b in Service.bodies if "Q: answer 0" in b["query"])  # requests ran concurrently
    assert first["query"] == ["Q: answer 0", "Q: answer 1"] and first["prompts"] == ["Q: ", "Q: "]
    assert first["labels"] == ["0", "x"] and first["data_sources"] == ["chat", "chat"]


def test_dropped_connections_are_retried(url):
    Service.behaviour = "flaky"
    with _manager(url) as manager:
        assert _score(manager).scores.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert len(Service.bodies) == 3


@pytest.mark.parametrize(
    ("behaviour", "requests", "message"),
    [
        ("slow", 3, r"no answer from .* after 3 tries \(1 s each\): TimeoutError"),
        ("drop", 3, r"no answer from .* after 3 tries"),
        ("500", 3, r"after 3 tries .*HTTP 500 .*model server says no"),
        ("400", 1, r"answered HTTP 400 .*model server says no"),
        ("garbage", 1, r"not JSON: '<html>not json</html>'"),
        ("short", 1, r"answered 3 rewards for 4 rows"),
    ],
)
def test_a_bad_answer_fails_the_rows_in_bounded_time(url, behaviour, requests, message):
    Service.behaviour = behaviour
    start = time.monotonic()
    with _manager(url) as manager:
        batch = _score(manager)
    assert time.monotonic() - start < 3 * (1.0 + 0.2) + 0.05 + 0.1 + 1.0  # tries x (timeout + answer) + back-off
    assert batch.scores.tolist() == [-1.0] * 4 and batch.metrics["reward/remote/failures"] == 4
    assert len(Service.bodies) == requests  # a broken answer is not asked again
    assert re.search(message, batch.errors[0]), batch.errors[0]


def test_one_bad_reward_fails_its_row_only(url):
    Service.behaviour = "bad_row"
    with _manager(url) as manager:
        batch = _score(manager)
    assert batch.scores.tolist() == [-1.0, 0.0, 1.0, 0.0] and "reward 'high', not a number" in batch.errors[0]


def test_a_reward_beyond_float32_fails_its_row(url):
    Service.behaviour = "huge"
    with _manager(url) as manager:
        batch = _score(manager)
    assert batch.scores.tolist() == [-1.0, -1.0, 1.0, 0.0] and batch.metrics["reward/failures"] == 2
    assert "outside the float32 range" in batch.errors[0]


class Trickle:
    """A server on the loopback address that answers every request by sending a byte every ``gap_s``, for at most
    ``give_up_s`` (so that a client without a total bound still returns, late, and its test fails, not hangs): in
    the status line and headers, or in a body announced as 1 MB long."""

    def __init__(self, where: str, gap_s: float = 0.1, give_up_s: float = 6.0) -> None:
        self.where, self.gap_s, self.give_up_s = where, gap_s, give_up_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"
        self.requests = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.requests += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n"
        end = time.monotonic() + self.give_up_s
        with conn:
            try:
                conn.recv(65536)
                if self.where == "body":
                    conn.sendall(head)
                while time.monotonic() < end:
                    conn.sendall(b" " if self.where == "body" else b"X")
                    time.sleep(self.gap_s)
            except OSError:
                return

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("kind", ["remote", "judge"])
@pytest.mark.parametrize("where", ["headers", "body"])
def test_a_service_that_trickles_its_answer_fails_the_rows_within_the_total_bound(kind, where):
    # urllib's timeout bounds each socket operation, and a byte every 0.1 s never trips it
    server = Trickle(where)
    settings = {"timeout_s": 0.5, "retries": 1, "backoff_s": 0.1, "data_sources": ["chat"]}
    if kind == "remote":  # four chunks, two at a time: the second two find the batch's time spent
        remote = {"url": server.url, "batch_size": 1, "max_concurrency": 2, **settings}
        cfg = RewardConfig(remote=remote, failure_score=-1.0)
    else:
        cfg = RewardConfig(judge={"url": server.url, "template": "{response}", **settings}, failure_score=-1.0)
    try:
        with RewardManager(cfg, PluginManager()) as manager:
            start = time.monotonic()
            batch = _score(manager)
            took = time.monotonic() - start
    finally:
        server.close()
    assert took < 2 * 0.5 + 0.1 + 0.6, took  # (retries + 1) x timeout_s + the back-off, and some slack
    assert batch.scores.tolist() == [-1.0] * 4 and batch.metrics[f"reward/{kind}/failures"] == 4
    assert re.search(r"no answer from .* after 2 tries \(0.5 s each\): TimeoutError", batch.errors[0]), batch.errors
    if kind == "remote":
        assert "was not asked: TimeoutError: the batch's time (1.1 s" in batch.errors[3]


def test_a_dead_service_stops_a_watched_run_with_its_error():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with _manager(f"http://127.0.0.1:{port}/get_reward", watch=True, retries=1) as manager:
        with pytest.raises(RewardFailureError, match=r"remote.*ConnectionRefusedError"):
            _score(manager)


def test_settings_are_checked_at_start(url):
    for entry, message in [
        ({"url": "rm-host:5000"}, r"reward.remote: needs 'url', an http:// or https:// address"),
        ({"url": url, "timeout": 3}, r"unknown key\(s\) timeout"),
        ({"url": url, "max_concurrency": 0}, r"max_concurrency=0: expected a whole number of at least 1"),
        ({"url": url, "timeout_s": -1}, r"timeout_s=-1: expected a positive number"),
        ({"url": url, "domain": "format"}, r"the domain name 'format' is taken"),
    ]:
        with pytest.raises(ConfigError, match=message):
            RewardManager(RewardConfig(remote=entry), PluginManager())
    cfg = load_config(None, [f"reward.remote={{url: '{url}', data_sources: [chat], domain: rm}}"])
    with RewardManager(cfg.reward, PluginManager()) as manager:
        assert manager.domains_for("chat") == {"rm": 1.0}


def test_domain_map_routes_rows_to_the_service_with_a_weight(url):
    from armor_core.config.plugin_checks import validate_plugins

    cfg = load_config(None, [f"reward.remote={{url: '{url}', timeout_s: 5}}", "reward.domain_map.qa={remote: 2.0}"])
    validate_plugins(cfg, PluginManager())  # what armor run checks first
    with RewardManager(cfg.reward, PluginManager()) as manager:
        batch = manager.score(["Q: "] * 2, ["answer 4", "answer 5"], ["qa"] * 2, ["4", "4"])
    assert batch.scores.tolist() == [2.0, 0.0]
