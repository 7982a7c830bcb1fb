"""The SandboxFusion backend against stand-in services on the loopback address: one that speaks the API
(runs the code it is sent with ``subprocess``), one that hangs, one that answers 500, one that trickles its
answer a byte at a time."""

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from armor_rewards_code.domain import code_reward
from armor_rewards_code.sandbox import sandbox_python

ROW = {"inputs": ["3\n"], "outputs": ["9\n"]}
GOOD = "```python\nprint(int(input()) ** 2)\n```"


class Service(BaseHTTPRequestHandler):
    behaviour = "run"  # "run" | "hang" | "fail" | "fail_once" | "trickle"
    requests = []

    def do_POST(self):  # noqa: N802 - the http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        if self.behaviour == "hang":
            time.sleep(3)
            return
        if self.behaviour == "trickle":  # a byte every 0.1 s of an answer announced as 1 MB; gives up after 8 s
            self.send_response(200)
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            end = time.monotonic() + 8.0
            while time.monotonic() < end:
                try:
                    self.wfile.write(b" ")
                    self.wfile.flush()
                except OSError:  # the client hung up
                    return
                time.sleep(0.1)
            return
        if self.behaviour == "fail" or (self.behaviour == "fail_once" and len(self.requests) == 1):
            self.send_response(500)
            self.end_headers()
            return
        assert self.path == "/run_code" and body["language"] == "python"
        try:
            done = subprocess.run(
                [sandbox_python(), "-I", "-S", "-c", body["code"]],
                input=body["stdin"].encode(),
                capture_output=True,
                timeout=body["run_timeout"],
            )
            result = {
                "status": "Finished",
                "return_code": done.returncode,
                "stdout": done.stdout.decode(),
                "stderr": done.stderr.decode(),
                "execution_time": 0.1,
            }
        except subprocess.TimeoutExpired:
            result = {"status": "TimeLimitExceeded", "return_code": None, "stdout": "", "stderr": ""}
        answer = json.dumps({"status": "Success", "message": "", "compile_result": None, "run_result": result})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(answer.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def service():
    Service.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _score(server, response, behaviour, **kw):
    Service.behaviour = behaviour
    url = f"http://127.0.0.1:{server.server_address[1]}"
    return code_reward("", response, ROW, {}, sandbox_url=url, timeout_s=1.0, total_timeout_s=1.0, **kw)


def test_a_service_that_speaks_the_api_scores_like_the_local_sandbox(service):
    assert _score(service, GOOD, "run").score == 1.0
    assert _score(service, "```python\nprint(8)\n```", "run").score == 0.0
    sent = Service.requests[0]
    assert sent["run_timeout"] == 2.0 and "9\\n" not in sent["stdin"]  # expected outputs never leave the parent
    looping = _score(service, "```python\nwhile True: pass\n```", "run")
    assert looping.score == 0.0 and looping.sub_scores["timeouts"] == 1.0


def test_a_500_is_retried_and_a_service_that_keeps_failing_fails_closed(service):
    assert _score(service, GOOD, "fail_once").score == 1.0 and len(Service.requests) == 2
    Service.requests.clear()
    result = _score(service, GOOD, "fail")
    assert result.score == 0.0 and len(Service.requests) == 3  # first try and two retries


def test_a_hung_service_costs_the_row_its_deadline_not_more(service):
    start = time.monotonic()
    result = _score(service, GOOD, "hang")
    assert result.score == 0.0 and result.sub_scores["timeouts"] == 1.0
    assert time.monotonic() - start < 2.0 + 2.0 + 0.5  # deadline (total + 1 s) plus the service's start-up allowance


def test_a_service_that_trickles_its_answer_costs_the_row_its_deadline_not_more(service):
    # urllib's timeout bounds each socket operation: a byte every 0.1 s never trips it (issue 42, item 3)
    start = time.monotonic()
    result = _score(service, GOOD, "trickle")
    assert result.score == 0.0 and result.sub_scores["timeouts"] == 1.0
    assert time.monotonic() - start < 2.0 + 2.0 + 0.5  # the deadline and the service's start-up allowance, as above
