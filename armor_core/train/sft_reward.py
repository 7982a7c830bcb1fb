"""``armor sft --val-reward DOMAIN``: held-out accuracy measured by a reward domain instead of exact match.

Exact match is the right check where the ground truth is the answer (``"46"``). Where it is a set of
tests (the ``code`` domain's stdin/stdout cases), the held-out check must be what a recipe measures: a
greedy response passes when the domain scores it 1. It is scored in the reward pool as a run scores it
(``armor_core.rewards.manager``), so a program that hangs fails its row within ``reward.timeout_s``.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Callable, Iterator, Sequence

__all__ = ["parse_kwargs", "reward_passed"]


def parse_kwargs(items: Sequence[str], flag: str, example: str) -> dict[str, Any]:
    """``KEY=VALUE`` arguments of ``flag`` as a dict, each value read as JSON where it is JSON, else as text."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {item!r} is not KEY=VALUE (for example {example})")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


@contextlib.contextmanager
def reward_passed(
    domain: str | None, kwargs: Sequence[str] = ()
) -> Iterator[Callable[[list[dict], list[str]], list[bool]] | None]:
    """``passed(rows, responses) -> [bool]`` for ``evaluate_greedy``: True where ``domain`` (with the
    ``KEY=VALUE`` parameters ``kwargs``) scores the response 1 on its row's ``ground_truth``; a row whose
    scoring failed or timed out fails. Yields None when ``domain`` is None (exact match)."""
    if domain is None:
        yield None
        return
    from armor_core.config.schema import RewardConfig
    from armor_core.rewards.manager import RewardManager

    domain_kwargs = {domain: parse_kwargs(kwargs, "--val-reward-kwarg", "whole_response=true")}
    manager = RewardManager(RewardConfig(domain_map={}, domain_kwargs=domain_kwargs))
    manager.domain(domain)  # an unknown domain fails here, before any training

    def passed(rows: list[dict], texts: list[str]) -> list[bool]:
        n = len(rows)
        prompts, truths = [r["prompt"] for r in rows], [r["ground_truth"] for r in rows]
        batch = manager.score(prompts, texts, [domain] * n, truths, [{} for _ in rows])
        return [float(s) >= 1.0 and not e for s, e in zip(batch.scores, batch.errors)]

    with manager:
        yield passed
