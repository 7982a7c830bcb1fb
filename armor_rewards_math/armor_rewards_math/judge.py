"""The judging shared by the ``math`` and ``gsm8k`` domains: refuse, extract, compare, and apply the
anti-hacking rules. ``judge`` returns the sub-scores; the domains turn them into a score.

The order matters for cost: the response size and the ground truth are checked (``limits.py``)
before extraction, and every extracted value before anything parses it, so that no answer reaches
math-verify that could keep it busy for long.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from armor_rewards_math.extract import (
    LENIENT_SOURCE,
    SOURCES,
    Extraction,
    clean_answer,
    extract_answer,
    split_alternatives,
)
from armor_rewards_math.limits import MAX_ANSWER_CHARS, MAX_RESPONSE_CHARS, MAX_VALUES, refusal
from armor_rewards_math.numbers import DECIMAL_SEPARATORS, numbers_equal, parse_number, read_decimal_commas
from armor_rewards_math.verify import is_echo, is_equivalent, is_multi_valued, is_restatement, squash

__all__ = ["EXTRACTIONS", "SUB_SCORES", "Rules", "check_ground_truth", "gold_text", "judge"]

EXTRACTIONS = ("strict", "lenient")
_UNANCHORED = ("last_number", LENIENT_SOURCE)
SUB_SCORES = ("correct", "extracted", "format", "hedged", "restated", "echoed", "refused")


@dataclass(frozen=True)
class Rules:
    """How one domain judges (its parameters; see ``domains.py``)."""

    sources: tuple[str, ...]
    require_format: str | None = None
    fallback_last_number: bool = False
    extraction: str = "strict"
    decimal_separator: str = "auto"
    symbolic: bool = True
    check_restatement: bool = True

    def __post_init__(self) -> None:
        sources = tuple(self.sources)
        for s in sources + ((self.require_format,) if self.require_format else ()):
            if s not in SOURCES:
                raise ValueError(f"unknown answer format {s!r}; known: {', '.join(SOURCES)}")
        if self.extraction not in EXTRACTIONS:
            raise ValueError(
                f"extraction={self.extraction!r}: use 'strict' (anchored answers only) or 'lenient' (else the last "
                "math expression)"
            )
        if self.decimal_separator not in DECIMAL_SEPARATORS:
            raise ValueError(
                f"decimal_separator={self.decimal_separator!r}: use one of {', '.join(DECIMAL_SEPARATORS)}"
            )
        if self.fallback_last_number and "last_number" not in sources:
            sources = (*sources, "last_number")
        object.__setattr__(self, "sources", sources)


def check_ground_truth(ground_truth: Any, extra: Mapping[str, Any] | None = None) -> None:
    """Refuse a ground truth that is a dict or a list holding one (a record, not an answer), which
    ``str()`` would turn into text that no response could ever match. The domains'
    ``validate_ground_truth`` (``extra``, the row's other fields, is not needed).

    :raises ValueError: naming what was found and what is expected.
    """
    items = (
        ground_truth.tolist() if hasattr(ground_truth, "tolist") else ground_truth
    )  # Parquet list columns are numpy arrays
    if isinstance(items, Mapping) or (isinstance(items, (list, tuple)) and any(isinstance(x, Mapping) for x in items)):
        shown = repr(items)
        raise ValueError(
            f"ground_truth {shown[:120] + ('...' if len(shown) > 120 else '')} is "
            f"{'a dict' if isinstance(items, Mapping) else 'a list of dicts'}; expected the answer itself as text "
            "or a number, e.g. '42' or '\\frac{1}{2}': put the answer, not its record, in ground_truth (or "
            "verl's reward_model.ground_truth)"
        )


def gold_text(ground_truth: Any) -> str:
    """The answer inside a ground truth written as a solution (``... #### 42``, ``\\boxed{42}``,
    ``... Final Answer: The final answer is $28\\%$.``, ``$x$.``), found as in a response."""
    if ground_truth is None:
        raise ValueError("ground_truth is missing")
    check_ground_truth(ground_truth)
    gold = str(ground_truth)
    if "####" in gold:
        return clean_answer(gold.rsplit("####", 1)[1])
    stated = extract_answer(gold, ("boxed", "answer"))
    return ", ".join(stated.values) if stated.found else clean_answer(gold)


def judge(prompt: str, response: str, gold: str, rules: Rules) -> dict[str, float]:
    """The sub-scores (``SUB_SCORES``) of one response against the ground truth's answer ``gold``."""
    subs: dict[str, float] = dict.fromkeys(SUB_SCORES, 0.0)
    if len(response) > MAX_RESPONSE_CHARS or refusal(gold):
        subs["refused"] = 1.0
        return subs
    ext, echoed = _extract(prompt, response, rules)
    subs["echoed"] = float(echoed)
    if not ext.found:
        return subs
    subs["extracted"] = 1.0
    subs["format"] = float(
        ext.source == rules.require_format if rules.require_format else ext.source not in _UNANCHORED
    )
    if len(ext.values) > MAX_VALUES or any(refusal(v) for v in ext.values):
        subs["refused"] = 1.0
        return subs
    # auto: a ground truth such as "1,5" may be the number 1.5 or the list 1, 5; either reading scores
    readings = [rules.decimal_separator]
    if rules.decimal_separator == "auto" and read_decimal_commas(gold, "auto") != gold:
        readings.append("point")
    for separator in readings:
        verdict = _compare(prompt, gold, ext, rules, separator)
        if separator == readings[0] or verdict["correct"]:
            subs.update(verdict)
        if verdict["correct"]:
            break
    return subs


def _extract(prompt: str, response: str, rules: Rules) -> tuple[Extraction, bool]:
    """The final answer, skipping answers copied from the prompt; and whether one was skipped."""
    echoes: list[Extraction] = []

    def copied(answer: Extraction) -> bool:
        if is_echo(response, answer.end, prompt):
            echoes.append(answer)
            return True
        return False

    ext = extract_answer(response, rules.sources, lenient=rules.extraction == "lenient", skip=copied)
    if rules.require_format and ext.found and ext.source != rules.require_format:
        # "\boxed{5}. Final answer: 5": the required format holds the same final answer
        same = extract_answer(response, (rules.require_format,), skip=copied)
        if (
            same.found
            and len(same.values) == len(ext.values)
            and all(
                max(len(a), len(b)) <= MAX_ANSWER_CHARS and squash(a) == squash(b)
                for a, b in zip(same.values, ext.values)
            )
        ):
            ext = same
    return ext, bool(echoes)


def _compare(prompt: str, gold: str, ext: Extraction, rules: Rules, separator: str) -> dict[str, float]:
    """``hedged``, ``restated``, ``refused`` and ``correct`` with decimal commas read as ``separator`` says."""
    gold = read_decimal_commas(gold, separator)
    multi = is_multi_valued(gold)
    parts = [p for v in ext.values for p in split_alternatives(v)]
    # in a list ground truth a comma separates items: "1,5" answers {1, 5}, not 1.5
    distinct = _distinct(parts if multi else [read_decimal_commas(p, separator) for p in parts])
    out = {"hedged": float(len(distinct) > 1 and not multi), "restated": 0.0, "refused": 0.0, "correct": 0.0}
    answer = ", ".join(distinct) if multi else distinct[0]
    if refusal(answer):
        out["refused"] = 1.0
        return out
    if rules.check_restatement and is_restatement(answer, prompt, gold):
        out["restated"] = 1.0
    format_ok = ext.source == rules.require_format if rules.require_format else True
    if format_ok and not out["hedged"] and not out["restated"]:
        out["correct"] = float(is_equivalent(gold, answer, symbolic=rules.symbolic))
    return out


def _distinct(values: list[str]) -> list[str]:
    """Drop repeats: the same text, or the same plain number written differently."""
    out: list[str] = []
    for v in values:
        num = parse_number(v)
        if any(
            squash(v) == squash(o)
            or (num is not None and (on := parse_number(o)) is not None and numbers_equal(on, num))
            for o in out
        ):
            continue
        out.append(v)
    return out
