"""The ``arithmetic`` reward domain: the built-in ``arithmetic`` task's exact integer answers.

``"12+34="`` -> ``"46"`` scores 1.0, anything else 0.0. Sub-scores: ``correct``, ``well_formed``
(the whole response, whitespace stripped, is one integer with an optional sign) and ``hedged``
(the response holds several different integers). It ships with armor-rl, beside the task, so
that ``armor run`` with nothing else installed scores its own default dataset; a reward pack may
register richer domains under other names and a run may route ``arithmetic`` rows to them with
``reward.domain_map``. Pure Python, cannot hang: registered ``inline``.

Its scores on the task's rows are those of the ``arithmetic`` domain armor-rewards-math shipped
before this one replaced it (``tests/plugins/rewards/cases/arithmetic.jsonl``).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from armor_core import RewardDomain, RewardResult, hookimpl
from armor_core.hookspecs import RegisterRewardDomain

__all__ = ["arithmetic_reward", "check_integer_truth"]

_INTEGER = re.compile(r"^[+-]?\d+$")
_INTEGERS = re.compile(r"(?<!\d)[+-]?\d+")
# past 4300 digits int() refuses to parse (CPython's limit); no task answer is that long
_MAX_DIGITS = 4300


def arithmetic_reward(
    prompt: str, response: str, ground_truth: Any, extra: Mapping[str, Any], *, strict: bool = True
) -> RewardResult:
    """1.0 for the right integer, else 0.0.

    :param strict: the whole response (whitespace stripped) must be one integer, an optional sign
        allowed. With ``strict=False`` the integer may be surrounded by other text, but a response
        holding several different integers is hedging and scores 0.
    """
    gold = int(str(ground_truth).strip())
    text = response.strip()
    well_formed = bool(_INTEGER.match(text)) and len(text) <= _MAX_DIGITS
    found = {int(x) for x in _INTEGERS.findall(text) if len(x) <= _MAX_DIGITS}
    hedged = len(found) > 1
    correct = (well_formed and int(text) == gold) if strict else (not hedged and found == {gold})
    return RewardResult(
        float(correct), {"correct": float(correct), "well_formed": float(well_formed), "hedged": float(hedged)}
    )


def check_integer_truth(ground_truth: Any, extra: Mapping[str, Any] | None = None) -> None:
    """Refuse, when the rows are loaded, a ground truth that is not an integer (``validate_ground_truth``).

    :raises ValueError: naming what was found and what is expected.
    """
    text = str(ground_truth).strip()
    try:
        int(text)
    except ValueError:
        shown = text if len(text) <= 60 else text[:60] + "..."
        raise ValueError(
            f"ground_truth {shown!r} is not an integer; the arithmetic domain compares integer answers "
            "(e.g. '46' or '-7'); route other answers to another domain with reward.domain_map"
        ) from None


@hookimpl
def armor_register_reward_domains(register: RegisterRewardDomain) -> None:
    register(
        "arithmetic",
        RewardDomain(
            arithmetic_reward,
            requires_ground_truth=True,
            description="exact integer answer of the built-in arithmetic task",
            score_range=(0.0, 1.0),
            validate_ground_truth=check_integer_truth,
            inline=True,
        ),
    )
