"""The answer of a short-answer response and whether it matches an accepted one: the anchoring rules
of ``short_answer``.

**Where the answer is.** The last answer statement ("Answer: ...", "Final answer: ...", "The
answer is ...", ``\\boxed{...}``, "答案：...", "答案是/为 ...", "答：...") wins; the answer is what
follows it up to the end of its sentence. Without one, the answer is the last sentence of the last
non-empty line. A statement copied from the prompt (the 64 characters of the response that end
with it appear verbatim in the prompt) is passed over, as in ``multiple_choice``; when no statement
of the response's own is left, it has no answer (the end of the response is not read instead).

**The candidate.** From that span: markdown, quotes and a trailing parenthetical are dropped
("Na (from natrium)" is "Na"), and so is an appositive clause after a comma ("Paris, which is
also its largest city" is "Paris"; "曹雪芹，他是清代小说家" is "曹雪芹"); then, if a copula remains,
what follows the last one ("The capital of France is Paris" gives "Paris"; "首都为北京" gives
"北京"; "12 x 12 = 144" gives "144"; the passive "written by X", and naming verbs, "called X",
"原名X", count as copulas). The subject before a copula is never the answer, so
"Paris is London" cannot answer both.

**Matching** (see ``match``): the candidate, or the whole span, equals an accepted answer after
``text.normalize``; or, when the accepted answer is a number (with or without a unit), the
candidate holds exactly one number and it is the same quantity (``quantity.same_quantity``):
"World War II ended in 1945" answers 1945, "about 5 kilometres" answers 5 km.

**Hedging**: a span offering alternatives ("Paris or Lyon", "5 km or 6 km", "北京或上海",
"可能是北京，也可能是南京", "Paris/Lyon") scores 0, unless an accepted answer itself contains
the connective ("salt or pepper").
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Sequence

from armor_rewards_qa.quantity import Quantity, find_quantities, parse_quantity, same_quantity
from armor_rewards_qa.text import normalize, token_f1, tokens

__all__ = ["Answer", "Match", "match", "read_answer"]

_ECHO_CHARS = 64  # as in armor_rewards_math: a copied passage this long rarely matches by chance
_SPAN_CHARS = 500  # an answer is at most this long: a statement's sentence is cut there
_MAX_STATEMENTS = 64  # statements read back from the end: past that, a response is padding, not answering
_MARKDOWN = re.compile(r"\*\*|__|`")
_ANCHORS = [
    re.compile(p, re.I)
    for p in (
        r"\b(?:final\s+|correct\s+|short\s+)?answer\s*(?:[:：=]|\bis\b|\bwould\s+be\b|\bshould\s+be\b)[\s:：=]*",
        r"答案\s*(?:应该|应当|应|就|即)?\s*(?:是|为)?\s*[:：]?",
        r"答(?!案)\s*[:：]",
    )
]
_BOXED = re.compile(r"\\boxed\s*\{((?:[^{}]|\{[^{}]*\})*)\}")
# a point ends a sentence before a space, unless it closes an initialism ("D.C.")
_SENTENCE_END = re.compile(r"(?<!\.[A-Z])[.!?](?=\s|$)|[。！？;；\n]")
_APPOSITIVE = re.compile(
    r"\s*(?:[,，]\s*(?:(?:who|which|whom|whose|where|when|that|because|since|as|born|located|known|also|a|an|the)\b|"
    r"它|他|她|这|那|因为|由于|位于|是|即|也就是)|[—–]|\s-\s).*$",
    re.I | re.S,
)
_PARENTHETICAL = re.compile(r"\s*[(（\[【][^()（）\[\]【】]*[)）\]】]\s*$")
_QUOTES = "\"'“”‘’「」『』《》"
_COPULA = re.compile(
    r"(?:\b(?:is|are|was|were|equals|'s|called|named|known\s+as|\w+(?:ed|en)\s+by)\b|=|叫做|称为|名为|原名|本名|"
    r"(?<![但还于否只总凡可倒硬要老真])是(?!否)|(?<![因认成作以行])为(?![了何什]))\s*",
    re.I,
)
_LEADING = re.compile(
    r"^(?:i\s+(?:think|believe|guess)\s+(?:that\s+)?|probably\s+|perhaps\s+|maybe\s+|我(?:认为|觉得|想)|应该|可能)\s*",
    re.I,
)
_HEDGE = re.compile(r"\b(?:or|either)\b|或者|或是|或(?!许)|还是|也可能", re.I)


@dataclass(frozen=True)
class Answer:
    """Where a response's answer is: ``span`` (whole) and ``candidate`` (reduced), see the module docstring."""

    span: str
    candidate: str
    anchored: bool
    echoed: bool = False


@dataclass(frozen=True)
class Match:
    correct: bool
    hedged: bool
    f1: float


def _sentence(text: str, start: int) -> str:
    stop = _SENTENCE_END.search(text, start, start + _SPAN_CHARS)
    return text[start : stop.start() if stop else start + _SPAN_CHARS]


def _last_statement(text: str, prompt: str) -> tuple[str | None, bool]:
    """The span of the last answer statement (None if there is none); and whether a later one was echoed.

    Read from the end, at most ``_MAX_STATEMENTS`` of them, so that the work stays linear in the
    response however many statements it holds.
    """
    echoed = False
    matches = [*_BOXED.finditer(text), *(m for p in _ANCHORS for m in p.finditer(text))]
    for m in sorted(matches, key=lambda m: m.start(), reverse=True)[:_MAX_STATEMENTS]:
        span, end = (
            (m.group(1), m.end())
            if m.re is _BOXED
            else (_sentence(text, m.end()), m.end() + len(_sentence(text, m.end())))
        )
        if not span.strip(" \t" + _QUOTES):
            continue
        if end >= _ECHO_CHARS and text[end - _ECHO_CHARS : end] in prompt:
            echoed = True
            continue
        return span, echoed
    return None, echoed


def _reduce(span: str) -> str:
    """The candidate in ``span``: no quotes, parenthetical or appositive; what follows the last copula."""
    text = span.strip().strip(_QUOTES + " .。!！")
    for _ in range(2):
        text = _PARENTHETICAL.sub("", text).strip(_QUOTES + " .。")
    text = _APPOSITIVE.sub("", text).strip(_QUOTES + " ")
    copulas = list(_COPULA.finditer(text))
    if copulas and copulas[-1].end() < len(text):
        text = text[copulas[-1].end() :]
    return _LEADING.sub("", text.strip()).strip(_QUOTES + " .。")


def read_answer(response: str, prompt: str = "", *, require_anchor: bool = False) -> Answer:
    """Where the answer of ``response`` is (see the module docstring)."""
    text = _MARKDOWN.sub("", unicodedata.normalize("NFKC", response))
    prompt = _MARKDOWN.sub("", unicodedata.normalize("NFKC", prompt))
    span, echoed = _last_statement(text, prompt)
    if span is not None:
        return Answer(span.strip(), _reduce(span), True, echoed)
    if require_anchor or echoed:  # a response whose last statement repeats the prompt has no answer of its own
        return Answer("", "", False, echoed)
    lines = [line.strip(" \t>#*-") for line in text.splitlines()]
    line = next((x for x in reversed(lines) if x), "")[-4 * _SPAN_CHARS :]  # room for any answer's sentence
    sentences = [s for s in re.split(r"(?<=[.!?])\s+(?=\S)|(?<=[。！？])\s*(?=\S)", line) if s.strip(" .。!！?？")]
    span = sentences[-1].strip() if sentences else ""
    return Answer(span, _reduce(span), False, echoed)


def _as_quantity(text: str) -> Quantity | None:
    exact = parse_quantity(text)
    if exact is not None:
        return exact
    found = find_quantities(text, limit=2)
    return found[0] if len(found) == 1 else None


def match(
    answer: Answer, accepted: Sequence[str], *, units: bool = False, rel_tol: float = 0.0, abs_tol: float = 0.0
) -> Match:
    """Whether ``answer`` is one of the ``accepted`` answers (aliases); its best token F1 against them (1 if it is
    one)."""
    f1 = max((token_f1(tokens(answer.candidate), tokens(a)) for a in accepted), default=0.0)
    hedge = _HEDGE.search(answer.span)
    if hedge and not any(_HEDGE.search(a) for a in accepted):
        return Match(False, True, f1)
    forms = {normalize(answer.candidate), normalize(answer.span)} - {""}
    if any(normalize(a) in forms for a in accepted):
        return Match(True, False, 1.0)
    got = _as_quantity(answer.candidate)
    for a in accepted:
        want = parse_quantity(a)
        if (
            want is not None
            and got is not None
            and same_quantity(got, want, convert=units, rel_tol=rel_tol, abs_tol=abs_tol)
        ):
            return Match(
                True, False, 1.0
            )  # F1 is never below exact match, as in SQuAD: 5000 m for 5 km shares no token
    return Match(False, False, f1)
