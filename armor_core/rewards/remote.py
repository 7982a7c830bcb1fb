"""Rewards from an HTTP service: ``reward.remote``, in the request and response shapes of OpenRLHF's
remote reward model (``--remote_rm_url``), so a server written for it answers ARMOR unchanged.

    reward:
      remote:
        - {url: http://rm-host:5000/get_reward, data_sources: [chat], timeout_s: 30, max_concurrency: 4}

Request: ``POST url`` with a JSON body, one per chunk of at most ``batch_size`` rows::

    {"query": [prompt + response, ...], "prompts": [...], "labels": [ground truth, ...],
     "responses": [...], "data_sources": [...]}

(``query``, ``prompts`` and ``labels`` are OpenRLHF's keys; ``responses`` and ``data_sources`` are
ARMOR's additions, which such servers ignore.) Response: a JSON object with ``rewards`` (or
``scores``), one number per row, and optionally ``extra_logs``: ``{name: [one number per row]}``,
logged as sub-scores (``reward/<domain>/<name>``). A row whose reward is missing or not a number fails.

Robustness: at most ``max_concurrency`` requests in flight; each try has ``timeout_s`` for the whole
exchange, connecting, sending and reading the answer to its last byte (a server that trickles its answer,
or never stops sending, is cut there: the connection's socket is shut at the deadline, since urllib's own
timeout bounds each socket operation, not the request); a refused or dropped connection, a timeout, a 5xx or
a 429 is retried up to ``retries`` times after ``backoff_s * 2**attempt`` seconds; any other 4xx, or a 200
whose body is not the shape above (or is over 64 MiB), fails that chunk's rows at once (retrying a broken
answer gives the same answer). One batch has ``(retries + 1) * timeout_s`` plus the back-off in all
(``total_bound``), a deadline its chunks share: a chunk still waiting for a slot or a try when it passes
fails. Failed rows score ``reward.failure_score``, and the failure watch (``reward.max_failure_fraction``
over ``reward.failure_window`` batches) stops a run whose service is down, with the service's last error.
"""

from __future__ import annotations

import http.client
import json
import math
import numbers
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping, Sequence

from armor_core.config.schema import ConfigError
from armor_core.interfaces import RewardDomain, RewardResult
from armor_core.ops.bounded_http import within
from armor_core.rewards.batch import OneRowFromBatch
from armor_core.rewards.custom import SOURCE_KEY
from armor_core.rewards.entries import Entries

__all__ = ["RemoteReward", "RemoteRewardError", "load_remote", "post_json", "total_bound"]

_DEFAULTS = {
    "domain": "remote",
    "data_sources": [],
    "timeout_s": 30.0,
    "max_concurrency": 4,
    "batch_size": 32,
    "retries": 3,
    "backoff_s": 1.0,
    "headers": {},
    "requires_ground_truth": False,
}
_RETRIED_STATUS = {429, 500, 502, 503, 504}
_MAX_ANSWER_BYTES = 64 * 2**20  # a JSON of rewards is small; a server that streams without end is cut here


class RemoteRewardError(RuntimeError):
    """A chunk of rows the service did not score; the message says why, and after how many tries."""


class RemoteReward(OneRowFromBatch):
    """The ``batch_fn`` of a ``reward.remote`` domain: posts the rows, returns one RewardResult per row."""

    wants_data_source = True  # the manager puts each row's data_source in its extra

    def __init__(self, url: str, *, timeout_s: float, max_concurrency: int, batch_size: int, retries: int,
                 backoff_s: float, headers: Mapping[str, str]) -> None:  # fmt: skip
        self.url, self.timeout_s, self.max_concurrency = url, timeout_s, max_concurrency
        self.batch_size, self.retries, self.backoff_s, self.headers = batch_size, retries, backoff_s, dict(headers)

    def __repr__(self) -> str:
        return f"RemoteReward({self.url})"

    def score_batch(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        ground_truths: Sequence[Any],
        extras: Sequence[Mapping[str, Any]],
    ) -> list[RewardResult | Exception]:
        sources = [dict(e or {}).get(SOURCE_KEY) for e in extras]
        spans = [range(i, min(i + self.batch_size, len(prompts))) for i in range(0, len(prompts), self.batch_size)]
        deadline = time.monotonic() + total_bound(self.timeout_s, self.retries, self.backoff_s)  # the whole batch's

        def one(span: range) -> list[RewardResult | Exception]:
            body = {
                "query": [prompts[i] + responses[i] for i in span],
                "prompts": [prompts[i] for i in span],
                "labels": [_jsonable(ground_truths[i]) for i in span],
                "responses": [responses[i] for i in span],
                "data_sources": [sources[i] for i in span],
            }
            try:
                return _results(self._post(body, deadline), len(span), self.url)
            except RemoteRewardError as e:
                return [e] * len(span)

        with ThreadPoolExecutor(max_workers=max(1, min(self.max_concurrency, len(spans)))) as pool:
            return [result for chunk in pool.map(one, spans) for result in chunk]

    def _post(self, body: dict, deadline: float) -> Any:
        return post_json(self.url, body, self.headers, self.timeout_s, self.retries, self.backoff_s, deadline)


def post_json(
    url: str,
    body: dict,
    headers: Mapping[str, str],
    timeout_s: float,
    retries: int,
    backoff_s: float,
    deadline: float | None = None,
) -> Any:
    """POST ``body`` as JSON and return the decoded answer, under the retry rules of the module docstring.

    :param deadline: a ``time.monotonic()`` time no try goes past (a batch's, shared by its requests); default
        ``total_bound`` from now.
    :raises RemoteRewardError: saying why, after how many tries."""
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **headers}
    deadline = deadline if deadline is not None else time.monotonic() + total_bound(timeout_s, retries, backoff_s)
    problem, tries = "", 0
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(max(0.0, min(backoff_s * 2 ** (attempt - 1), deadline - time.monotonic())))
        seconds = min(timeout_s, deadline - time.monotonic())
        if seconds <= 0 and not tries:
            total = total_bound(timeout_s, retries, backoff_s)
            raise RemoteRewardError(
                f"{url} was not asked: TimeoutError: the batch's time ({total:g} s for timeout_s={timeout_s:g}, "
                f"retries={retries}) ran out before this request's turn"
            )
        if seconds <= 0:
            break
        tries += 1
        try:
            return _decoded(url, _request(url, data, headers, seconds))
        except _Retry as e:
            problem = str(e)
    raise RemoteRewardError(f"no answer from {url} after {tries} tries ({timeout_s:g} s each): {problem}")


def total_bound(timeout_s: float, retries: int, backoff_s: float) -> float:
    """The seconds a call of ``post_json`` (or a batch of them) may take: every try at ``timeout_s``, and the
    back-off between tries."""
    return (retries + 1) * timeout_s + sum(backoff_s * 2**k for k in range(retries))


class _Retry(Exception):
    """A try that may succeed if made again (refused, dropped, timed out, 5xx, 429); the message says why."""


def _request(url: str, data: bytes, headers: Mapping[str, str], seconds: float) -> bytes:
    """One POST's answer body, all of it within ``seconds`` (``ops.bounded_http``: urllib's ``timeout`` bounds
    each socket operation, not the request, so a server sending a byte a second would never trip it).

    :raises _Retry: a try to make again; ``RemoteRewardError`` for an answer that would be the same again."""
    with within(seconds) as opener:
        try:
            with opener.open(
                urllib.request.Request(url, data, dict(headers), method="POST"), timeout=seconds
            ) as answer:
                text = answer.read(_MAX_ANSWER_BYTES + 1)
            if opener.expired:  # the answer was cut short: what was read is not all of it
                raise _Retry(f"TimeoutError: no whole answer within {seconds:.2g} s")
            if len(text) > _MAX_ANSWER_BYTES:
                raise RemoteRewardError(
                    f"{url} answered more than {_MAX_ANSWER_BYTES // 2**20} MiB; expected a short JSON"
                )
            return text
        except urllib.error.HTTPError as e:
            problem = f"HTTP {e.code} {e.reason}: {_head(e.read(1000) if not opener.expired else b'')}"
            if e.code not in _RETRIED_STATUS:
                raise RemoteRewardError(f"{url} answered {problem}") from None
            raise _Retry(problem) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:  # refused, dropped, timed out, cut
            if opener.expired:
                raise _Retry(f"TimeoutError: no whole answer within {seconds:.2g} s") from None
            reason = getattr(e, "reason", e)
            raise _Retry(f"{type(reason).__name__}: {reason}") from None


def _decoded(url: str, text: bytes) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise RemoteRewardError(f"{url} answered something that is not JSON: {_head(text)}") from None


def _results(reply: Any, n: int, url: str) -> list[RewardResult | Exception]:
    """One RewardResult per row from the service's JSON, or the error of a row it did not score."""
    if not isinstance(reply, Mapping):
        raise RemoteRewardError(f"{url} answered a JSON {type(reply).__name__}; expected an object with 'rewards'")
    rewards = reply.get("rewards", reply.get("scores"))
    if not isinstance(rewards, list) or len(rewards) != n:
        got = f"{len(rewards)} rewards" if isinstance(rewards, list) else f"keys {sorted(map(str, reply))}"
        raise RemoteRewardError(f"{url} answered {got} for {n} rows; expected 'rewards': a list of {n} numbers")
    logs = reply.get("extra_logs")
    logs = logs if isinstance(logs, Mapping) else {}
    columns = {str(k): v for k, v in logs.items() if isinstance(v, list) and len(v) == n}
    out: list[RewardResult | Exception] = []
    for i, reward in enumerate(rewards):
        if not _number(reward):
            out.append(RemoteRewardError(f"{url} gave row {i} of its chunk the reward {reward!r}, not a number"))
            continue
        subs = {k: float(v[i]) for k, v in columns.items() if _number(v[i])}
        out.append(RewardResult(float(reward), subs))
    return out


def _number(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(float(x))


def _jsonable(x: Any) -> Any:
    try:
        json.dumps(x)
        return x
    except (TypeError, ValueError):
        return str(x)


def _head(text: bytes | str) -> str:
    text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    return repr(text[:200])


def load_remote(value: Any, known: Sequence[str], where: str = "reward.remote") -> tuple[dict, dict]:
    """The domains of ``reward.remote`` (a mapping, or a list of them): ``({domain: RewardDomain},
    {data_source: domain})``. :raises ConfigError: naming the entry and the key."""
    entries = Entries(value, where, _DEFAULTS, ["url"], known)
    for at, entry in entries:
        if not str(entry["url"]).startswith(("http://", "https://")):
            raise ConfigError(f"{at}: needs 'url', an http:// or https:// address of the reward service")
        entries.seconds(entry, at, ["timeout_s"])
        entries.seconds(entry, at, ["backoff_s"], zero=True)
        entries.whole(entry, at, ["max_concurrency", "batch_size"])
        entries.whole(entry, at, ["retries"], least=0)
        client = RemoteReward(
            str(entry["url"]),
            timeout_s=float(entry["timeout_s"]),
            max_concurrency=entry["max_concurrency"],
            batch_size=entry["batch_size"],
            retries=entry["retries"],
            backoff_s=float(entry["backoff_s"]),
            headers=entry["headers"],
        )
        # inline: the client bounds its own time (timeouts, tries) and waits on the network, not a core
        domain = RewardDomain(
            fn=client,
            batch_fn=client.score_batch,
            inline=True,
            score_range=None,
            requires_ground_truth=bool(entry["requires_ground_truth"]),
            description=f"the reward service at {entry['url']}",
        )
        entries.add(at, entry, domain)
    return entries.domains, entries.routes
