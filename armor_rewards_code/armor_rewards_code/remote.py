"""The remote backend: the same harness, run by a SandboxFusion service (the HTTP API verl supports).

One ``POST {url}/run_code`` per row with ``{"code": <harness>, "language": "python", "stdin": <the
frames>, "run_timeout", "compile_timeout", "memory_limit_MB"}``; the answer's ``run_result.stdout`` is
the harness's result frame, judged here exactly as a local run's (``domain.score_report``). A service
that does not answer within the row's deadline (its whole answer: one trickled a byte at a time is cut
there), or answers a 5xx or a ``SandboxError``, is retried up to ``retries`` times while the deadline
allows; after that the row gets no report, which fails every case.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request

from armor_core.ops.bounded_http import within
from armor_rewards_code.harness import frame
from armor_rewards_code.sandbox import HARNESS_SOURCE, Limits, SandboxRun, _parse

__all__ = ["SandboxFusion"]

_MAX_ANSWER_BYTES = 64 * 2**20  # a run's answer holds its output, cut to the sandbox's output limit; far less


class SandboxFusion:
    """A SandboxFusion service at ``url``; ``run`` has the signature of ``LocalSandbox.run``."""

    isolated = True  # the program runs on the service's machine, never on this host

    def __init__(self, url: str, limits: Limits | None = None, *, retries: int = 2) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"code sandbox_url {url!r} must be an http:// or https:// address")
        self.url = url.rstrip("/") + "/run_code"
        self.limits = limits or Limits()
        self.retries = retries

    def _post(self, body: bytes, timeout: float) -> dict | None:
        """The service's answer, whole within ``timeout`` (a service that trickles it is cut there: urllib's own
        timeout bounds each socket operation, not the request), or None for a try to make again."""
        request = urllib.request.Request(self.url, body, {"Content-Type": "application/json"}, method="POST")
        try:
            with within(timeout) as opener:
                with opener.open(request, timeout=timeout) as answer:
                    text = answer.read(_MAX_ANSWER_BYTES + 1)
                if opener.expired or len(text) > _MAX_ANSWER_BYTES:  # cut at the deadline, or never ending
                    return None
            reply = json.loads(text)
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):  # refused, 5xx, cut, not JSON
            return None
        if not isinstance(reply, dict) or reply.get("status") == "SandboxError":
            return None
        return reply

    def run(self, config: dict, secret: dict | None, deadline_s: float) -> SandboxRun:
        config = {**config, "max_output": self.limits.output_bytes}
        stdin = (frame(config) + (frame(secret) if secret is not None else b"")).decode()
        body = json.dumps(
            {
                "code": HARNESS_SOURCE,
                "language": "python",
                "stdin": stdin,
                "run_timeout": deadline_s,
                "compile_timeout": 10,
                "memory_limit_MB": self.limits.memory_mb,
            }
        ).encode()
        end = time.monotonic() + deadline_s + 2.0  # the service's own start-up, on top of the run
        for _ in range(self.retries + 1):
            left = end - time.monotonic()
            if left <= 0:
                break
            reply = self._post(body, left)
            if reply is not None:
                result = reply.get("run_result") or {}
                stdout = result.get("stdout") if isinstance(result, dict) else None
                report = _parse(stdout.encode()) if isinstance(stdout, str) else None
                return SandboxRun(report, True, result.get("status") == "TimeLimitExceeded", str(result.get("stderr")))
        return SandboxRun(None, True, True, f"no answer from {self.url} within {deadline_s:g} s")
