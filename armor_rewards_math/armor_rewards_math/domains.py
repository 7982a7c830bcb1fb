"""The reward domains: ``math``, ``gsm8k`` and ``arithmetic``.

Each is ``fn(prompt, response, ground_truth, extra, **params) -> RewardResult``; ``params`` come
from ``reward.domain_kwargs.<domain>`` in the run config. The score is ``correct_score`` for a
correct answer and ``wrong_score`` otherwise (plus the overlong penalty when configured); the
sub-scores say why:

- ``correct``   1 if the answer counted as correct (after every anti-hacking rule)
- ``extracted`` 1 if an answer was found at all
- ``format``    1 if it was found in the required format (any anchored format when none is required)
- ``hedged``    1 if the final answer holds several different values (``\\boxed{1}, \\boxed{2}``,
  ``1 or 2``) where the ground truth has one: scored as wrong
- ``restated``  1 if the answer is an unevaluated expression copied from the prompt: scored as wrong
- ``overlong``  the DAPO overlong penalty (<= 0), only when ``overlong_max_length`` is set

``arithmetic`` and ``gsm8k`` are pure Python and cannot hang, so they carry ``armor_inline = True``:
ARMOR's RewardManager then scores them in the calling process (no process hop). ``math`` may call
sympy, which can hang on pathological input, so it runs in the RewardManager's worker processes
under the hard ``reward.timeout_s`` limit; its ``armor_warmup`` imports sympy before the clock starts.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from armor_core import RewardResult

from armor_rewards_math.extract import SOURCES, Extraction, extract_answer, split_alternatives
from armor_rewards_math.numbers import numbers_equal, parse_number
from armor_rewards_math.verify import is_equivalent, is_multi_valued, is_restatement, squash, warm_up

__all__ = ["arithmetic_reward", "gsm8k_reward", "math_reward", "overlong_penalty"]


def overlong_penalty(length: int, max_length: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", eq. 13), scaled by ``factor``.

    0 up to ``max_length - buffer``; then falling linearly to -1 at ``max_length``; -1 beyond.
    """
    start = max_length - buffer
    if length <= start:
        return 0.0
    if length > max_length or buffer <= 0:
        return -float(factor)
    return factor * (start - length) / buffer


def _response_length(response: str, extra: Mapping[str, Any], unit: str) -> int:
    if unit == "chars":
        return len(response)
    if unit != "tokens":
        raise ValueError(f"overlong_unit={unit!r}: use 'tokens' (extra['response_length'], set by the trainer) or 'chars'")
    if "response_length" not in extra:
        raise ValueError("overlong penalty in tokens needs the row's extra['response_length'] (the trainer sets it); "
                         "use overlong_unit='chars' to measure characters instead")
    return int(extra["response_length"])


def _gold_text(ground_truth: Any) -> str:
    """The answer inside a ground truth written as a solution (``... #### 42``, ``\\boxed{42}``)."""
    if ground_truth is None:
        raise ValueError("ground_truth is missing")
    gold = str(ground_truth)
    if "####" in gold:
        return gold.rsplit("####", 1)[1].strip()
    boxed = extract_answer(gold, ("boxed",))
    return ", ".join(boxed.values) if boxed.found else gold.strip()


def _check_sources(sources: Sequence[str], require_format: str | None) -> tuple[str, ...]:
    sources = tuple(sources)
    for s in sources + ((require_format,) if require_format else ()):
        if s not in SOURCES:
            raise ValueError(f"unknown answer format {s!r}; known: {', '.join(SOURCES)}")
    return sources


def _judge(prompt: str, response: str, gold: str, extra: Mapping[str, Any], *, sources: Sequence[str],
           fallback_last_number: bool, require_format: str | None, symbolic: bool, check_restatement: bool,
           correct_score: float, wrong_score: float, overlong_max_length: int | None, overlong_buffer: int,
           overlong_penalty_factor: float, overlong_unit: str) -> RewardResult:
    sources = _check_sources(sources, require_format)
    if fallback_last_number and "last_number" not in sources:
        sources = (*sources, "last_number")
    ext: Extraction = extract_answer(response, sources)
    subs = {"correct": 0.0, "extracted": float(ext.found), "format": 0.0, "hedged": 0.0, "restated": 0.0}
    correct = False
    if ext.found:
        subs["format"] = float(ext.source == require_format if require_format else ext.source != "last_number")
        multi = is_multi_valued(gold)
        values = [p for v in ext.values for p in split_alternatives(v)]
        distinct = _distinct(values)
        if len(distinct) > 1 and not multi:
            subs["hedged"] = 1.0
        answer = ", ".join(distinct) if multi else distinct[0]
        if check_restatement and is_restatement(answer, prompt, gold):
            subs["restated"] = 1.0
        format_ok = ext.source == require_format if require_format else True
        if format_ok and not subs["hedged"] and not subs["restated"]:
            correct = is_equivalent(gold, answer, symbolic=symbolic)
    subs["correct"] = float(correct)
    score = correct_score if correct else wrong_score
    if overlong_max_length is not None:
        length = _response_length(response, extra, overlong_unit)
        subs["overlong"] = overlong_penalty(length, int(overlong_max_length), int(overlong_buffer), overlong_penalty_factor)
        score += subs["overlong"]
    return RewardResult(score=float(score), sub_scores=subs)


def _distinct(values: list[str]) -> list[str]:
    """Drop repeats: the same text, or the same plain number written differently."""
    out: list[str] = []
    for v in values:
        num = parse_number(v)
        if any(squash(v) == squash(o) or (num is not None and (on := parse_number(o)) is not None and numbers_equal(on, num)) for o in out):
            continue
        out.append(v)
    return out


def math_reward(prompt: str, response: str, ground_truth: Any, extra: Mapping[str, Any], *,
                sources: Sequence[str] = ("boxed", "answer"), fallback_last_number: bool = False,
                require_format: str | None = None, check_restatement: bool = True,
                correct_score: float = 1.0, wrong_score: float = 0.0,
                overlong_max_length: int | None = None, overlong_buffer: int = 0,
                overlong_penalty_factor: float = 1.0, overlong_unit: str = "tokens") -> RewardResult:
    """General math: the last ``\\boxed{}`` (or an "answer is" phrase) checked for equivalence.

    :param sources: answer formats to look for, in order (``boxed``, ``hash``, ``answer``, ``last_number``).
    :param fallback_last_number: if no anchored answer is found, use the last number in the response.
    :param require_format: only an answer in this format can score (e.g. ``boxed``).
    :param check_restatement: an unevaluated expression copied from the prompt does not score.
    :param overlong_max_length: DAPO's L_max; with ``overlong_buffer`` (L_cache) adds the overlong penalty.
    :param overlong_unit: ``tokens`` (``extra['response_length']``) or ``chars``.
    """
    return _judge(prompt, response, _gold_text(ground_truth), extra, sources=sources,
                  fallback_last_number=fallback_last_number, require_format=require_format, symbolic=True,
                  check_restatement=check_restatement, correct_score=correct_score, wrong_score=wrong_score,
                  overlong_max_length=overlong_max_length, overlong_buffer=overlong_buffer,
                  overlong_penalty_factor=overlong_penalty_factor, overlong_unit=overlong_unit)


def gsm8k_reward(prompt: str, response: str, ground_truth: Any, extra: Mapping[str, Any], *,
                 sources: Sequence[str] = ("hash", "boxed", "answer"), fallback_last_number: bool = True,
                 require_format: str | None = None, correct_score: float = 1.0, wrong_score: float = 0.0,
                 overlong_max_length: int | None = None, overlong_buffer: int = 0,
                 overlong_penalty_factor: float = 1.0, overlong_unit: str = "tokens") -> RewardResult:
    """GSM8K: a number after ``####`` (or boxed, or "the answer is", or the last number), compared exactly.

    The ground truth is a number or a GSM8K solution ending in ``#### <number>``. Only numbers are
    compared (no sympy), so an expression like ``48+24`` never scores. Parameters as for ``math``.
    """
    gold = _gold_text(ground_truth)
    if parse_number(gold) is None:
        raise ValueError(f"gsm8k ground truth {gold[:100]!r} is not a number; use the 'math' domain for other answers")
    return _judge(prompt, response, gold, extra, sources=sources, fallback_last_number=fallback_last_number,
                  require_format=require_format, symbolic=False, check_restatement=False,
                  correct_score=correct_score, wrong_score=wrong_score, overlong_max_length=overlong_max_length,
                  overlong_buffer=overlong_buffer, overlong_penalty_factor=overlong_penalty_factor, overlong_unit=overlong_unit)


_INTEGER = re.compile(r"^[+-]?\d+$")
_INTEGERS = re.compile(r"(?<!\d)[+-]?\d+")


def arithmetic_reward(prompt: str, response: str, ground_truth: Any, extra: Mapping[str, Any], *,
                      strict: bool = True) -> RewardResult:
    """The built-in arithmetic task: ``"12+34="`` -> ``"46"``. 1.0 for the right integer, else 0.0.

    :param strict: the whole response (whitespace stripped) must be one integer, an optional sign
        allowed. With ``strict=False`` the integer may be surrounded by other text, but a response
        holding several different integers is hedging and scores 0.
    """
    gold = int(str(ground_truth).strip())
    text = response.strip()
    # past 4300 digits int() refuses to parse (CPython's limit); no task answer is that long
    well_formed = bool(_INTEGER.match(text)) and len(text) <= 4300
    found = {int(x) for x in _INTEGERS.findall(text) if len(x) <= 4300}
    hedged = len(found) > 1
    if strict:
        correct = well_formed and int(text) == gold
    else:
        correct = not hedged and found == {gold}
    return RewardResult(float(correct), {"correct": float(correct), "well_formed": float(well_formed), "hedged": float(hedged)})


# Run by a RewardManager worker before its first timed check: importing sympy takes about a second.
math_reward.armor_warmup = warm_up  # type: ignore[attr-defined]
# Pure Python, microseconds, cannot hang: the RewardManager may score these in-process.
arithmetic_reward.armor_inline = True  # type: ignore[attr-defined]
gsm8k_reward.armor_inline = True  # type: ignore[attr-defined]
