"""Length measures for reward domains: a response's length, DAPO's soft overlong penalty, a target band.

Shared by the built-in ``length`` domain and the math pack's ``overlong_*`` parameters, so a length
is counted and penalised the same way wherever it is scored. Pure Python, O(1) a row.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["band_score", "overlong_penalty", "response_length"]


def overlong_penalty(length: int, max_length: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", eq. 13), scaled by ``factor``.

    0 up to ``max_length - buffer``; then falling linearly to ``-factor`` at ``max_length``; ``-factor`` beyond.
    """
    start = max_length - buffer
    if length <= start:
        return 0.0
    if length > max_length or buffer <= 0:
        return -float(factor)
    return factor * (start - length) / buffer


def response_length(response: str, extra: Mapping[str, Any], unit: str, param: str = "unit") -> int:
    """The response's length in ``unit``: ``chars`` (``len(response)``) or ``tokens`` (``extra["response_length"]``).

    :param param: the parameter's name in the caller, for the error message.
    """
    if unit == "chars":
        return len(response)
    if unit != "tokens":
        raise ValueError(f"{param}={unit!r}: use 'tokens' (extra['response_length'], set by the trainer) or 'chars'")
    if "response_length" not in extra:
        raise ValueError(
            f"a length in tokens needs the row's extra['response_length'] (the trainer sets it); "
            f"use {param}='chars' to measure characters instead"
        )
    return int(extra["response_length"])


def band_score(length: float, target_min: float | None, target_max: float | None, falloff: float | None) -> float:
    """1 inside ``[target_min, target_max]`` (``None``: that end open), falling linearly outside it to 0
    at ``falloff`` past the edge. Without ``falloff`` the fall is relative to the edge: below the band
    the score is ``length / target_min``, above it it reaches 0 at twice ``target_max``."""
    if target_min is not None and length < target_min:
        width = target_min if falloff is None else falloff
        return max(0.0, 1.0 - (target_min - length) / width) if width > 0 else 0.0
    if target_max is not None and length > target_max:
        width = target_max if falloff is None else falloff
        return max(0.0, 1.0 - (length - target_max) / width) if width > 0 else 0.0
    return 1.0
