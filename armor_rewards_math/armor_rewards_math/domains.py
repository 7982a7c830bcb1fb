"""The reward domains: ``math`` and ``gsm8k``.

Each is ``fn(prompt, response, ground_truth, extra, **params) -> RewardResult``; ``params`` come
from ``reward.domain_kwargs.<domain>`` in the run config. The score is ``correct_score`` for a
correct answer and ``wrong_score`` otherwise (plus the overlong penalty when configured); the
sub-scores of ``math`` and ``gsm8k`` say why (``judge.py`` computes them):

- ``correct``   1 if the answer counted as correct (after every anti-hacking rule)
- ``extracted`` 1 if an answer was found at all
- ``format``    1 if it was found in the required format (any anchored format when none is required)
- ``hedged``    1 if the final answer holds several different values (``\\boxed{1}, \\boxed{2}``,
  ``1 or 2``) where the ground truth has one: scored as wrong
- ``restated``  1 if the answer is an unevaluated expression copied from the prompt: scored as wrong
- ``echoed``    1 if an answer copied from the prompt (the end of a passage repeated verbatim, such
  as a few-shot example) was passed over; the answer before it, if any, is the one scored
- ``refused``   1 if the response or an answer was too large or too deeply nested to check
  (``limits.py``): scored as wrong without being parsed
- ``overlong``  the DAPO overlong penalty (<= 0), only when ``overlong_max_length`` is set; the
  same function as the general ``length`` domain's (``armor_core.ops.lengths``), which
  scores length on its own, as a separate weighted component

``gsm8k`` is pure Python and cannot hang, so it is registered with
``inline=True``: ARMOR's RewardManager then scores them in the calling process (no process hop).
``math`` may call sympy, which can hang on pathological input, so it runs in the RewardManager's
worker processes under the hard ``reward.timeout_s`` limit; its ``warmup`` (``warm_up``) imports
sympy before the clock starts (about a second).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from armor_core import RewardResult
from armor_core.ops.lengths import overlong_penalty, response_length
from armor_rewards_math.judge import Rules, gold_text, judge
from armor_rewards_math.numbers import parse_number, read_decimal_commas
from armor_rewards_math.verify import warm_up

__all__ = ["answer_score_range", "gsm8k_reward", "math_reward", "overlong_penalty", "warm_up"]


def _result(
    subs: dict[str, float],
    response: str,
    extra: Mapping[str, Any],
    *,
    correct_score: float,
    wrong_score: float,
    overlong_max_length: int | None,
    overlong_buffer: int,
    overlong_penalty_factor: float,
    overlong_unit: str,
) -> RewardResult:
    score = correct_score if subs["correct"] else wrong_score
    if overlong_max_length is not None:
        length = response_length(response, extra, overlong_unit, param="overlong_unit")
        subs["overlong"] = overlong_penalty(
            length, int(overlong_max_length), int(overlong_buffer), overlong_penalty_factor
        )
        score += subs["overlong"]
    return RewardResult(score=float(score), sub_scores=subs)


def math_reward(
    prompt: str,
    response: str,
    ground_truth: Any,
    extra: Mapping[str, Any],
    *,
    sources: Sequence[str] = ("boxed", "answer"),
    fallback_last_number: bool = False,
    require_format: str | None = None,
    extraction: str = "strict",
    decimal_separator: str = "auto",
    check_restatement: bool = True,
    correct_score: float = 1.0,
    wrong_score: float = 0.0,
    overlong_max_length: int | None = None,
    overlong_buffer: int = 0,
    overlong_penalty_factor: float = 1.0,
    overlong_unit: str = "tokens",
) -> RewardResult:
    """General math: the final ``\\boxed{}`` (or "Final answer: ...") checked for equivalence.

    :param sources: the anchored answer formats to look for (``boxed``, ``hash``, ``answer``, ``last_number``).
    :param fallback_last_number: if no anchored answer is found, use the last number in the response.
    :param require_format: only an answer in this format can score (e.g. ``boxed``).
    :param extraction: ``strict``: anchored answers only; ``lenient``: without one, the last math span
        or number (for prompts that do not ask for a box). The anti-hacking rules apply to both.
    :param decimal_separator: ``auto`` (``1,5`` alone is 1.5, ``1,500`` is 1500), ``point`` or ``comma``.
    :param check_restatement: an unevaluated expression copied from the prompt does not score.
    :param overlong_max_length: DAPO's L_max; with ``overlong_buffer`` (L_cache) adds the overlong penalty.
    :param overlong_unit: ``tokens`` (``extra['response_length']``) or ``chars``.
    """
    rules = Rules(
        tuple(sources),
        require_format,
        fallback_last_number,
        extraction,
        decimal_separator,
        symbolic=True,
        check_restatement=check_restatement,
    )
    subs = judge(prompt, response, gold_text(ground_truth), rules)
    return _result(
        subs,
        response,
        extra,
        correct_score=correct_score,
        wrong_score=wrong_score,
        overlong_max_length=overlong_max_length,
        overlong_buffer=overlong_buffer,
        overlong_penalty_factor=overlong_penalty_factor,
        overlong_unit=overlong_unit,
    )


def gsm8k_reward(
    prompt: str,
    response: str,
    ground_truth: Any,
    extra: Mapping[str, Any],
    *,
    sources: Sequence[str] = ("hash", "boxed", "answer"),
    fallback_last_number: bool = True,
    require_format: str | None = None,
    extraction: str = "strict",
    decimal_separator: str = "auto",
    correct_score: float = 1.0,
    wrong_score: float = 0.0,
    overlong_max_length: int | None = None,
    overlong_buffer: int = 0,
    overlong_penalty_factor: float = 1.0,
    overlong_unit: str = "tokens",
) -> RewardResult:
    """GSM8K: a number after ``####`` (or boxed, or "the answer is", or the last number), compared exactly.

    The ground truth is a number or a GSM8K solution ending in ``#### <number>``. Only numbers are
    compared (no sympy), so an expression like ``48+24`` never scores. Parameters as for ``math``.
    """
    gold = gold_text(ground_truth)
    rules = Rules(
        tuple(sources),
        require_format,
        fallback_last_number,
        extraction,
        decimal_separator,
        symbolic=False,
        check_restatement=False,
    )
    if parse_number(read_decimal_commas(gold, decimal_separator)) is None:
        raise ValueError(f"gsm8k ground truth {gold[:100]!r} is not a number; use the 'math' domain for other answers")
    subs = judge(prompt, response, gold, rules)
    return _result(
        subs,
        response,
        extra,
        correct_score=correct_score,
        wrong_score=wrong_score,
        overlong_max_length=overlong_max_length,
        overlong_buffer=overlong_buffer,
        overlong_penalty_factor=overlong_penalty_factor,
        overlong_unit=overlong_unit,
    )


def answer_score_range(params: Mapping[str, Any]) -> tuple[float, float]:
    """The scores ``math`` and ``gsm8k`` can give with ``params``: between ``wrong_score`` and
    ``correct_score``, widened by the overlong penalty (-``overlong_penalty_factor`` at most) when set."""
    low, high = sorted((float(params["correct_score"]), float(params["wrong_score"])))
    if params.get("overlong_max_length") is not None:
        factor = float(params["overlong_penalty_factor"])
        low, high = low - max(factor, 0.0), high + max(-factor, 0.0)
    return low, high
