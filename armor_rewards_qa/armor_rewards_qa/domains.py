"""The reward domains: ``multiple_choice`` and ``short_answer``.

Each is ``fn(prompt, response, ground_truth, extra, **params) -> RewardResult``; ``params`` come
from ``reward.domain_kwargs.<domain>`` in the run config (``armor reward ... -p key=value``). The
score is ``correct_score`` for a correct answer and ``wrong_score`` otherwise.

``multiple_choice`` (rules in ``choice.py``). Ground truth: a letter (``"B"``, ``"(b)"``), several
for a question with more than one right option (``["A", "C"]``, ``"AC"``, ``"A, C"``), or an
option's text. Options: the row's ``extra["options"]`` (or ``extra["choices"]``), a mapping
``{"A": "Venus", "B": "Mars"}`` or a list ``["Venus", "Mars"]`` lettered A, B, ... in order;
without them the letters the prompt labels (``A.``, ``(B)``, ...), else A-D, and option texts are
then unknown. Sub-scores: ``correct``; ``extracted`` (some option was chosen); ``hedged`` (the
answer offers alternatives, "A or B", or names several letters where one is right, or every
letter where fewer are right: scored as wrong); ``anchored`` (chosen in an answer statement);
``by_text`` (the option's text, not its letter); ``echoed`` (a statement copied from the prompt was
passed over).

``short_answer`` (rules in ``short.py``). Ground truth: the accepted answer, or a list of them
(aliases), or such a list as a JSON string (``'["Paris", "Paris, France"]'``, for the CLI).
Sub-scores: ``correct``; ``hedged`` (alternatives: scored as wrong); ``f1`` (the best token F1 of
the candidate against an accepted answer, character-level for Chinese, 1 when the answer is
correct; shown, not scored, unless ``score_f1``); ``anchored`` (found after an answer statement); ``echoed``.

Both are pure Python over linear-time patterns: registered with ``inline=True``, scored in the calling
process. A ground truth that does not fit (a letter that is not among the options, an empty alias
list) raises ``ValueError`` saying what would fit; ``check_choice_truth`` and ``check_accepted_answers``
(each domain's ``validate_ground_truth``) find such rows when the dataset is loaded.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from armor_core import RewardResult
from armor_rewards_qa.choice import Choice, letters_in_prompt, parse_options, read_choice
from armor_rewards_qa.short import match, read_answer
from armor_rewards_qa.text import normalize

__all__ = [
    "ChoiceVerdict",
    "accepted_answers",
    "answer_score_range",
    "check_accepted_answers",
    "check_choice_truth",
    "choice_truth",
    "judge_choice",
    "multiple_choice_reward",
    "short_answer_reward",
]

_DEFAULT_LETTERS = ("A", "B", "C", "D")


def _options(extra: Mapping[str, Any]) -> dict[str, str]:
    for key in ("options", "choices"):
        if extra.get(key) is not None:
            return parse_options(extra[key], where=f"extra[{key!r}]")
    return {}


def _json_list(value: Any) -> Any:
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            return value
        return parsed if isinstance(parsed, list) else value
    return value


def choice_truth(ground_truth: Any, options: Mapping[str, str], letters: Sequence[str]) -> frozenset[str]:
    """The right option letters from a ground truth (see the module docstring).

    :raises ValueError: an empty ground truth, a letter not among ``letters`` when the options are
        known, or a text that is no option's.
    """
    value = _json_list(ground_truth)
    text = str(value).strip() if not isinstance(value, (list, tuple)) else ""
    if isinstance(value, (list, tuple)):
        items = [str(x).strip() for x in value]
    elif re.fullmatch(r"[A-Z]{2,26}", text):
        items = list(text)  # "AC"
    elif re.fullmatch(r"[A-Za-z](?:\s*[,、/;\s]\s*[A-Za-z])+", text):
        items = re.findall(r"[A-Za-z]", text)  # "A, C"
    else:
        items = [text]
    by_text = {normalize(t): k for k, t in options.items()}
    gold = set()
    for item in filter(None, items):
        letter = re.fullmatch(r"[(\[]?([A-Za-z])[)\].]?", item)
        if letter:
            gold.add(letter.group(1).upper())
        elif normalize(item) in by_text:
            gold.add(by_text[normalize(item)])
        else:
            raise ValueError(
                f"multiple_choice ground truth {ground_truth!r}: {item!r} is neither an option letter nor an "
                "option's text"
                + (f" (options: {', '.join(f'{k}={v!r}' for k, v in options.items())})" if options else "")
            )
    if not gold:
        raise ValueError(
            f"multiple_choice ground truth {ground_truth!r} is empty: give a letter such as 'B' or letters such as "
            "['A', 'C']"
        )
    outside = sorted(gold - set(letters))
    if outside and options:
        raise ValueError(
            f"multiple_choice ground truth {ground_truth!r}: {', '.join(outside)} not among the options "
            f"{', '.join(letters)}"
        )
    return frozenset(gold)


def check_choice_truth(ground_truth: Any, extra: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` if ``multiple_choice`` cannot score this row's ground truth (checked at load).

    With the row's options known, every letter must be among them and a text must be an option's;
    without them, the ground truth must name letters.
    """
    options = _options(extra)
    choice_truth(ground_truth, options, sorted(options) or list(_DEFAULT_LETTERS))


@dataclass(frozen=True)
class ChoiceVerdict:
    """How ``multiple_choice`` judged a response: the right letters, what was read, and the outcome."""

    gold: frozenset[str]
    choice: Choice
    hedged: bool
    correct: bool


def judge_choice(
    prompt: str,
    response: str,
    ground_truth: Any,
    extra: Mapping[str, Any],
    *,
    allow_text: bool = True,
    strict: bool = False,
) -> ChoiceVerdict:
    """Read the chosen option and compare it with the ground truth (parameters as ``multiple_choice_reward``)."""
    options = _options(extra)
    letters = sorted(options) or letters_in_prompt(prompt) or list(_DEFAULT_LETTERS)
    gold = choice_truth(ground_truth, options, letters)
    if not options:  # letters guessed from the prompt: a ground truth outside them extends them
        letters = [chr(c) for c in range(ord("A"), max(ord(x) for x in (*letters, *gold)) + 1)]
    choice = read_choice(response, letters, options, prompt, allow_text=allow_text, strict=strict)
    chosen = set(choice.letters)
    hedged = choice.alternatives or (len(gold) == 1 and len(chosen) > 1) or (chosen == set(letters) and gold != chosen)
    return ChoiceVerdict(gold, choice, hedged, not hedged and chosen == gold)


def multiple_choice_reward(
    prompt: str,
    response: str,
    ground_truth: Any,
    extra: Mapping[str, Any],
    *,
    allow_text: bool = True,
    strict: bool = False,
    correct_score: float = 1.0,
    wrong_score: float = 0.0,
) -> RewardResult:
    """Score the option a response chose (see the module docstring and ``choice.py``).

    :param allow_text: an answer may quote an option's text instead of its letter.
    :param strict: only an answer statement counts ("Answer: B", "答案是B"): no weaker statement
        ("I'd go with B") and no bare letter at the end.
    """
    v = judge_choice(prompt, response, ground_truth, extra, allow_text=allow_text, strict=strict)
    subs = {
        "correct": float(v.correct),
        "extracted": float(bool(v.choice.letters)),
        "hedged": float(v.hedged),
        "anchored": float(v.choice.source == "statement"),
        "by_text": float(v.choice.by_text),
        "echoed": float(v.choice.echoed),
    }
    return RewardResult(float(correct_score if v.correct else wrong_score), subs)


def accepted_answers(ground_truth: Any) -> list[str]:
    """The accepted answers of a ``short_answer`` ground truth: a string, a list, or a JSON list string."""
    value = _json_list(ground_truth)
    answers = [str(a) for a in value] if isinstance(value, (list, tuple)) else [str(value)]
    answers = [a for a in answers if a.strip()]
    if not answers:
        raise ValueError(
            f"short_answer ground truth {ground_truth!r} holds no answer: give a string or a non-empty list of "
            "accepted answers"
        )
    return answers


def check_accepted_answers(ground_truth: Any, extra: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` if a ``short_answer`` ground truth holds no accepted answer (checked at load)."""
    accepted_answers(ground_truth)


def short_answer_reward(
    prompt: str,
    response: str,
    ground_truth: Any,
    extra: Mapping[str, Any],
    *,
    units: bool = False,
    rel_tol: float = 0.0,
    abs_tol: float = 0.0,
    require_anchor: bool = False,
    score_f1: bool = False,
    correct_score: float = 1.0,
    wrong_score: float = 0.0,
) -> RewardResult:
    """Score a short answer against the accepted ones (see the module docstring and ``short.py``).

    :param units: convert between units of one dimension (``5 km`` = ``5000 m``); without it a
        quantity must be given in the accepted answer's unit (under any name of it: ``5 kilometres``).
    :param rel_tol: relative tolerance for numbers (0: equal up to float rounding).
    :param abs_tol: absolute tolerance for numbers, in the accepted answer's SI unit when ``units``.
    :param require_anchor: only an answer after an answer statement ("Answer: ...", "答案是...") counts.
    :param score_f1: score the token F1 (between ``wrong_score`` and ``correct_score``) instead of
        exact match; a hedged answer still scores ``wrong_score``.
    """
    accepted = accepted_answers(ground_truth)
    answer = read_answer(response, prompt, require_anchor=require_anchor)
    result = match(answer, accepted, units=units, rel_tol=rel_tol, abs_tol=abs_tol)
    subs = {
        "correct": float(result.correct),
        "hedged": float(result.hedged),
        "f1": result.f1,
        "anchored": float(answer.anchored),
        "echoed": float(answer.echoed),
    }
    if score_f1:
        fraction = 1.0 if result.correct else 0.0 if result.hedged else result.f1
        return RewardResult(float(wrong_score + (correct_score - wrong_score) * fraction), subs)
    return RewardResult(float(correct_score if result.correct else wrong_score), subs)


def answer_score_range(params: Mapping[str, Any]) -> tuple[float, float]:
    """The scores both domains can give with ``params``: between ``wrong_score`` and ``correct_score``."""
    low, high = sorted((float(params["correct_score"]), float(params["wrong_score"])))
    return low, high


# Pure Python over linear-time patterns, microseconds a row: scored in the calling process.
