"""What a reward domain's configuration and results must satisfy: parameters the domain accepts,
scores within its declared range, and a failure rate low enough to train on.

``check_params`` refuses a ``reward.domain_kwargs`` key the domain's function does not take.
``resolve_score_range`` turns a domain's declared ``score_range`` (a pair, a function of its keyword
parameters, or None) into the ``(low, high)`` its scores are checked against; ``range_problem``
says why a score falls outside. The ``RewardManager`` fails such a row as it would one whose
domain raised.

``FailureWatch`` stops a training run when a domain fails on more than
``reward.max_failure_fraction`` of its rows over the last ``reward.failure_window`` scored
batches. Without it a domain that cannot score (a ground truth in a format it cannot read, a
verifier that always times out) gives every row ``reward.failure_score``, the policy learns from
a constant, and the run ends with exit code 0.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections import Counter, deque
from typing import Any, Callable, Mapping

from armor_core.config.schema import ConfigError
from armor_core.errors import UserFacingError

__all__ = ["FailureWatch", "RewardFailureError", "check_params", "range_problem", "resolve_score_range"]

_SHOWN_ERROR_CHARS = 300


class RewardFailureError(UserFacingError):
    """A reward domain failed on too many rows; the run stops (its checkpoints are kept)."""


def keyword_defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    """The defaults of ``fn``'s keyword parameters after the four row arguments."""
    try:
        params = list(inspect.signature(fn).parameters.values())[4:]
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def check_params(name: str, fn: Callable[..., Any], params: Mapping[str, Any]) -> None:
    """Every configured parameter must be a keyword the domain's function accepts (after the 4 row arguments)."""
    if not params:
        return
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    ps = list(sig.parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in ps):
        return
    accepted = [
        p.name for p in ps[4:] if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    for key in params:
        if key not in accepted:
            close = difflib.get_close_matches(str(key), accepted, n=1, cutoff=0.5)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"reward.domain_kwargs.{name}: unknown parameter {key!r} for reward domain {name!r}.{hint} "
                f"It accepts: {', '.join(accepted) or 'no parameters'}"
            )


def resolve_score_range(
    name: str, declared: Any, fn: Callable[..., Any], params: Mapping[str, Any]
) -> tuple[float, float] | None:
    """The ``(low, high)`` of domain ``name`` with ``params`` configured; None when it declares none.

    :param declared: the domain's ``score_range``: a pair, None, or a function of the domain's
        keyword parameters (``fn``'s defaults updated with ``params``) returning a pair.
    :raises ConfigError: the declaration (or what its function returns) is not two numbers low <= high.
    """
    if callable(declared):
        try:
            declared = declared({**keyword_defaults(fn), **params})
        except Exception as e:  # the parameters are the user's: say which ones the range could not be computed for
            raise ConfigError(
                f"reward domain {name!r}: its score_range cannot be computed for the parameters {dict(params)} "
                f"(reward.domain_kwargs.{name}): {type(e).__name__}: {e}"
            ) from None
    if declared is None:
        return None
    try:
        low, high = (float(x) for x in declared)
    except (TypeError, ValueError):
        low = high = math.nan
    if not (math.isfinite(low) and math.isfinite(high) and low <= high):
        raise ConfigError(
            f"reward domain {name!r} declares score_range={declared!r}; expected (low, high), two finite numbers "
            "with low <= high, a function of the domain's parameters returning them, or None"
        )
    return low, high


def range_problem(score: float, score_range: tuple[float, float] | None) -> str | None:
    """Why ``score`` is outside ``score_range`` (None when it is inside, or there is no range)."""
    if score_range is None:
        return None
    low, high = score_range
    slack = 1e-9 * max(1.0, abs(low), abs(high))  # float rounding in a domain's arithmetic, not a wrong score
    if low - slack <= score <= high + slack:
        return None
    return (
        f"score {score:g} is outside the domain's score_range [{low:g}, {high:g}]; return a score in it, "
        "or register the domain with the score_range its scores really have"
    )


class FailureWatch:
    """Counts each domain's failed and scored rows over the last ``window`` batches.

    :param max_fraction: ``observe`` raises once a domain's failures exceed this fraction of its
        rows in the window (judged from the first batch on; 1 never raises).
    :param window: batches the fraction is measured over.
    """

    def __init__(self, max_fraction: float, window: int) -> None:
        self.max_fraction = max_fraction
        self._batches: deque[tuple[Counter[str], Counter[str]]] = deque(maxlen=window)

    def observe(self, scored: Counter[str], failed: Counter[str], first_error: Mapping[str, str]) -> None:
        """Add one batch: rows scored and failed per domain, and a failed row's error per failing domain.

        :raises RewardFailureError: a domain failed on more than ``max_fraction`` of its rows in the window.
        """
        self._batches.append((scored, failed))
        for domain in failed:
            n = sum(s[domain] for s, _ in self._batches)
            bad = sum(f[domain] for _, f in self._batches)
            if n and bad > self.max_fraction * n:
                error = " ".join(first_error.get(domain, "").split())[:_SHOWN_ERROR_CHARS]
                batches = len(self._batches)
                raise RewardFailureError(
                    f"reward domain {domain!r} failed on {bad} of its {n} rows in the last {batches} scored "
                    f"batch{'es' if batches > 1 else ''}, more than "
                    f"reward.max_failure_fraction={self.max_fraction:g}; e.g. {error}. The run stops here, keeping "
                    f"the checkpoints already written: fix the domain or the data (`armor reward {domain} -i FILE` "
                    "scores rows without training), or raise reward.max_failure_fraction (1 never stops)"
                )
