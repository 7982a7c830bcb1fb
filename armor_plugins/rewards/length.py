"""The ``length`` reward domain: DAPO's soft overlong penalty and an optional target-length band.

Score, in [0, 1]: ``band + overlong``, floored at 0, where

- ``band`` is 1 inside ``[target_min, target_max]`` (either end may be left open) and falls
  linearly outside it, to 0 at ``falloff`` past the edge. Without ``falloff`` the fall is relative
  to the edge: below the band the score is ``length / target_min``, above it it reaches 0 at twice
  ``target_max``. Without a band, ``band`` is 1.
- ``overlong`` is DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", eq. 13), ``<= 0``: 0 up
  to ``overlong_max_length - overlong_buffer``, then linearly down to ``-overlong_penalty_factor``
  at ``overlong_max_length`` and beyond. Without ``overlong_max_length`` it is 0.

Sub-scores: ``length`` (the measured length), ``band`` and ``overlong`` (each when configured).
Length is counted in ``unit``: ``tokens`` (``extra["response_length"]``, which the trainer sets
from the response mask) or ``chars``. No ground truth is needed; pure Python and O(1) a row, so
the domain is inline. Route it beside a correctness domain with a small weight, e.g.
``reward.domain_map: {gsm8k: {gsm8k: 1.0, length: 0.1}}``.

The measures are ``armor_core.ops.lengths`` (``overlong_penalty``, ``response_length``,
``band_score``), which ``armor_rewards_math`` also uses for its ``overlong_*`` parameters (the
penalty added to a math score), so both places behave alike.
"""

from __future__ import annotations

from typing import Any, Mapping

from armor_core import RewardDomain, RewardResult, hookimpl
from armor_core.hookspecs import RegisterRewardDomain
from armor_core.ops.lengths import band_score, overlong_penalty, response_length

__all__ = ["check_config", "length_reward"]


def check_config(
    overlong_max_length: Any, overlong_buffer: Any, target_min: Any, target_max: Any, falloff: Any
) -> None:
    """Raise ``ValueError`` for parameters that score nothing or contradict each other."""
    if overlong_max_length is None and target_min is None and target_max is None:
        raise ValueError(
            "length: nothing to score; set overlong_max_length (DAPO's overlong penalty) and/or target_min / "
            "target_max (a target band) in reward.domain_kwargs.length"
        )
    for name, value in (
        ("overlong_max_length", overlong_max_length),
        ("target_min", target_min),
        ("target_max", target_max),
        ("falloff", falloff),
    ):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
            raise ValueError(f"length: {name}={value!r} must be a number >= 0")
    if overlong_max_length is not None and not 0 <= overlong_buffer <= overlong_max_length:
        raise ValueError(
            f"length: overlong_buffer={overlong_buffer!r} must be between 0 and "
            f"overlong_max_length={overlong_max_length!r}"
        )
    if target_min is not None and target_max is not None and target_min > target_max:
        raise ValueError(f"length: target_min={target_min!r} is above target_max={target_max!r}")


def length_reward(
    prompt: str,
    response: str,
    ground_truth: Any,
    extra: Mapping[str, Any],
    *,
    overlong_max_length: int | None = None,
    overlong_buffer: int = 0,
    overlong_penalty_factor: float = 1.0,
    target_min: float | None = None,
    target_max: float | None = None,
    falloff: float | None = None,
    unit: str = "tokens",
) -> RewardResult:
    """Score a response's length (see the module docstring).

    :param overlong_max_length: DAPO's L_max; with ``overlong_buffer`` (L_cache) the overlong penalty.
    :param overlong_penalty_factor: the penalty at and past ``overlong_max_length`` (DAPO: 1).
    :param target_min: the band's lower edge (None: open); :param target_max: its upper edge.
    :param falloff: the distance outside the band over which ``band`` falls from 1 to 0.
    :param unit: ``tokens`` or ``chars``.
    """
    check_config(overlong_max_length, overlong_buffer, target_min, target_max, falloff)
    length = response_length(response, extra, unit)
    subs = {"length": float(length)}
    band = 1.0
    if target_min is not None or target_max is not None:
        band = subs["band"] = band_score(length, target_min, target_max, falloff)
    overlong = 0.0
    if overlong_max_length is not None:
        overlong = subs["overlong"] = overlong_penalty(
            length, int(overlong_max_length), int(overlong_buffer), overlong_penalty_factor
        )
    return RewardResult(max(0.0, band + overlong), subs)


def _score_range(params: Mapping[str, Any]) -> tuple[float, float]:
    # computed when the run's reward domains are bound, before any worker starts: parameters that
    # score nothing are an error then, not a failed score on every row
    check_config(
        *(params[k] for k in ("overlong_max_length", "overlong_buffer", "target_min", "target_max", "falloff"))
    )
    return 0.0, 1.0


@hookimpl
def armor_register_reward_domains(register: RegisterRewardDomain) -> None:
    register(
        "length",
        RewardDomain(
            length_reward,
            requires_ground_truth=False,
            inline=True,
            score_range=_score_range,
            description="DAPO's soft overlong penalty and an optional target-length band, in [0, 1]",
        ),
    )
