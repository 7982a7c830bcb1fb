"""Find the final answer in a model's response, and notice when it hedges.

Sources, each a name usable in the ``sources`` / ``require_format`` domain parameters:

- ``boxed``: ``\\boxed{...}`` or ``\\fbox{...}`` with nested braces. Boxes that follow each other
  with only connectives between them (``\\boxed{1}, \\boxed{2}``, ``$\\boxed{1}$ or $\\boxed{2}$``,
  ``\\(\\boxed{1}\\) and \\(\\boxed{2}\\)``) form one final answer with several values.
- ``hash``: GSM8K's ``#### 42``.
- ``answer``: ``Answer: ...`` (at the start of a line or sentence), ``Final answer: ...``, "the
  (final) answer is ...", ``答案是 ...``. A clause is reduced to its value: "Final Answer: The
  largest $n$ is 34." gives ``34``.
- ``last_number``: the last plain number in the text; a fallback, off unless asked for, since any
  number the model happens to write last would count.

Which answer is final: the last one in the text among the explicit ones (boxes, ``####``,
"Final answer ...", a line opening with ``Answer:``); a bare "the answer is ..." counts only when
there is no explicit answer, since models write it while checking ("if the answer is 5, then ...");
and a phrase whose value is only words ("I hope the answer is correct") counts only when nothing
else does. ``last_number`` comes after all of these, and lenient extraction (the last math span or
number, as math-verify's own parser reads a response) after that.

A box cut off by the length limit (unbalanced braces) is not an answer.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

__all__ = [
    "LENIENT_SOURCE",
    "SOURCES",
    "Extraction",
    "extract_answer",
    "find_boxed",
    "split_alternatives",
    "split_top_level",
    "clean_answer",
]

SOURCES = ("boxed", "hash", "answer", "last_number")
#: The source of an answer found by lenient extraction (never a required format).
LENIENT_SOURCE = "last_expression"

_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
_FLAT_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{([^{}\\]*)\}")  # no braces inside: no need to count them
_BRACE_OR_ESCAPE = re.compile(r"[{}\\]")
# what may stand between two boxes (or math spans) of one final answer
_CONNECTIVE = re.compile(
    r"(?:[\s,;.$]|\\[,;:!()\[\]]|\\q?quad|\\text\{\s*(?:or|and)\s*\}"
    r"|\b(?:or|and|maybe|perhaps|possibly|alternatively|either)\b|或者|或许|或|和|以及|也可能是|可能是|、|，)*",
    re.I,
)
_HASH = re.compile(r"####\s*([^\n]*)")
_EXPLICIT, _IMPLICIT, _WORDS_ONLY = 2, 1, 0
_LAST_SPANS = 1000  # of each kind of anchored answer, only the last ones are read (see _chains)
_BOX_BRACES = 1000
_TAIL_CHARS = 20_000
# (pattern, tier): the value is group "a"
_ANSWER_PATTERNS = [
    # "Final answer: 42" anywhere; "Answer: 42", "**Answer:** 42" at the start of a line or sentence
    (
        re.compile(
            r"(?:final\s+answer|(?:^|(?<=[.!?]\s))[ \t>#*_-]*answer)\s*(?:\*\*)?\s*[:：]\s*(?:\*\*)?(?P<a>[^\n]+)",
            re.I | re.M,
        ),
        _EXPLICIT,
    ),
    # "the final answer is 42." to the end of the sentence (a dot between digits is a decimal point)
    (re.compile(r"final\s+answer\s+(?:is|would\s+be|=)\s*:?\s*(?P<a>(?:[^\n.]|\.(?=\d))+)", re.I), _EXPLICIT),
    (re.compile(r"(?:the|my)\s+answer\s+(?:is|would\s+be|=)\s*:?\s*(?P<a>(?:[^\n.]|\.(?=\d))+)", re.I), _IMPLICIT),
    (re.compile(r"最终答案\s*(?:是|为|应为)?\s*[:：]?\s*(?P<a>[^\n。]+)"), _EXPLICIT),
    (re.compile(r"(?<!最终)答案\s*(?:是|为|应为)?\s*[:：]?\s*(?P<a>[^\n。]+)"), _IMPLICIT),
]
_SENTENCE_END = re.compile(r"\.(?=\s)|。")
_TRAILING_CLAUSE = re.compile(r"(?:^|\s|,|，)(?:which|because|since|as|so)\b|(?:因为|所以)", re.I)
# "The largest $n$ is 34": a clause that opens with a word and states the value after its verb
_CLAUSE = re.compile(r"^[A-Za-z]")
_VERB = re.compile(r"\s(?:is|are|equals|was|were|becomes|would\s+be|will\s+be)\s+", re.I)
_PROSE_MATH = re.compile(r"[$\\^=+*/<>≤≥√π∞]")  # math in a clause, beside its numbers
_MATH_LIKE = re.compile(r"[\d$\\^=+*/<>≤≥√π∞]|^\(?[A-Za-z]\)?$")
# a plain number: thousands grouped by commas or spaces ("1 000" is one number, not 1 and 000)
_PLAIN_NUMBER = r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d{1,3}(?:[ \u00a0\u202f\u2009]\d{3})+(?!\d)(?:\.\d+)?|\d+(?:[.,]\d+)?|\.\d+)"  # noqa: E501 (one regular expression)
_LAST_NUMBER = re.compile(_PLAIN_NUMBER + r"(?:\s*%)?")
# lenient extraction also reads a fraction, written 3/4 or as LaTeX outside math delimiters (\frac{10}{9}),
# whose digits are otherwise read as numbers of their own
_EXPRESSION_NUMBER = re.compile(
    r"-?\\[dt]?frac\s*\{\s*\d+\s*\}\s*\{\s*\d+\s*\}|" + _PLAIN_NUMBER + r"(?:\s*/\s*\d+)?(?:\s*%)?"
)
_MATH_DELIMITER = re.compile(r"\\\\|\\\$|\$\$|\$|\\\(|\\\)|\\\[|\\\]")
_CLOSER = {"$$": "$$", "$": "$", "\\(": "\\)", "\\[": "\\]"}
_OR_SPLIT = re.compile(r"[\s(]+or\s+|\s*或者?\s*", re.I)  # "7 or 8", "7 (or 8)", "7或8"
_TEXT_OR = re.compile(r"\\(?:text|textrm|mbox|mathrm)\s*\{\s*(or|或)\s*\}", re.I)
_RELATION = re.compile(r"[=<>≤≥≠]|\\(?:le|ge|leq|geq|lt|gt|neq|ne|cup|cap|in)\b")


@dataclass(frozen=True)
class Extraction:
    """The final answer: ``values`` has one entry, or several when boxes were chained.

    ``start`` and ``end`` delimit it in the text (the whole chain, for chained boxes).
    """

    values: tuple[str, ...] = ()
    source: str | None = None
    start: int = -1
    end: int = -1

    @property
    def found(self) -> bool:
        return bool(self.values)


def find_boxed(text: str) -> list[tuple[int, int, str]]:
    """Every outermost balanced ``\\boxed{...}``: (start, end, content), in order.

    A box holding more than ``_BOX_BRACES`` braces is no answer anyone writes (the limits would
    refuse it): it is taken to run to the end of the text, and nothing after it is read, so that
    a megabyte of braces costs no more than a thousand.
    """
    out: list[tuple[int, int, str]] = []
    end = -1
    for m in _BOX_START.finditer(text):
        if m.start() < end:  # a box inside the previous one
            continue
        flat = _FLAT_BOX.match(text, m.start())
        close = flat.end() if flat else _closing_brace(text, m.end())
        if close is None:  # cut off by the length limit: not an answer
            break
        if close < 0:
            out.append((m.start(), len(text), text[m.end() :]))
            break
        end = close
        out.append((m.start(), close, text[m.end() : close - 1]))
    return out


def _closing_brace(text: str, i: int) -> int | None:
    """The index after the ``}`` that closes a ``{`` just before ``i``; None if there is none, -1 if
    more than ``_BOX_BRACES`` braces come first."""
    depth = 1
    for _ in range(_BOX_BRACES):
        c = _BRACE_OR_ESCAPE.search(text, i)
        if c is None:
            return None
        i = c.end() + (c.group() == "\\")  # \{ and \} are literal braces (sets), not grouping
        depth += {"{": 1, "}": -1}.get(c.group(), 0)
        if not depth:
            return i if i <= len(text) else None
    return -1


def _chains(spans: list[tuple[int, int, str]], text: str, source: str) -> list[Extraction]:
    """Join spans with only connectives between them into one answer with several values.

    Only the last ``_LAST_SPANS`` spans are read: the final answer is among them (a longer chain is
    refused anyway), and a megabyte of boxes costs no more than a thousand.
    """
    chains: list[list] = []  # [start, end, contents]
    for start, end, content in spans[-_LAST_SPANS:]:
        if chains and _CONNECTIVE.fullmatch(text, chains[-1][1], start):
            chains[-1][1] = end
            chains[-1][2].append(content)
        else:
            chains.append([start, end, [content]])
    return _answers([(start, end, content) for start, end, content in chains], source)


def _answers(found: Iterable[tuple[int, int, Sequence[str]]], source: str) -> list[Extraction]:
    out = []
    for start, end, raw in found:
        values = tuple(v for v in (clean_answer(r) for r in raw) if v)
        if values:
            out.append(Extraction(values, source, start, end))
    return out


def _phrase_value(raw: str) -> str:
    """The value an answer phrase states: up to the end of its sentence, before "which ...", after
    the verb of a clause ("The largest $n$ is 34." -> ``34``), or from the one number of a clause
    that holds no other math ("Jane started growing it 3 hours ago." -> ``3 hours ago``, a number
    with a unit)."""
    end = _SENTENCE_END.search(raw)
    s = raw[: end.start()] if end else raw
    cut = _TRAILING_CLAUSE.search(s)
    s = s[: cut.start()] if cut else s
    if _CLAUSE.match(s.strip()):
        verbs = list(_VERB.finditer(s))
        if verbs:
            s = s[verbs[-1].end() :]
        elif not _PROSE_MATH.search(s):
            numbers = _LAST_NUMBER.finditer(s)
            first, second = next(numbers, None), next(numbers, None)  # exactly one, without reading them all
            if first is not None and second is None:
                s = s[first.start() :]
    return s.strip(" ,，")


def _phrases(text: str) -> list[tuple[Extraction, int]]:
    out = []
    for rx, tier in _ANSWER_PATTERNS:
        for m in list(rx.finditer(text))[-_LAST_SPANS:]:
            for answer in _answers([(m.start("a"), m.end("a"), [_phrase_value(m.group("a"))])], "answer"):
                out.append((answer, tier if _MATH_LIKE.search(answer.values[0]) else _WORDS_ONLY))
    return out


def _anchored(text: str, sources: Sequence[str]) -> list[tuple[Extraction, int]]:
    """Every anchored answer with its tier, sorted so that the preferred one comes last."""
    found: list[tuple[Extraction, int]] = []
    for source in sources:
        if source == "boxed":
            found += [(a, _EXPLICIT) for a in _chains(find_boxed(text), text, "boxed")]
        elif source == "hash":
            hashes = list(_HASH.finditer(text))[-_LAST_SPANS:]
            found += [(a, _EXPLICIT) for a in _answers(((m.start(1), m.end(1), [m.group(1)]) for m in hashes), "hash")]
        elif source == "answer":
            found += _phrases(text)
        elif source != "last_number":
            raise ValueError(f"unknown answer source {source!r}; known sources: {', '.join(SOURCES)}")
    rank = {s: i for i, s in enumerate(sources)}
    return sorted(found, key=lambda a: (a[1], a[0].start, -rank[a[0].source or ""]))


def _math_spans(text: str, begin: int) -> list[tuple[int, int, str]]:
    """``$...$``, ``$$...$$``, ``\\(...\\)``, ``\\[...\\]`` from ``begin``: (start, end, content)."""
    spans, opened = [], None
    for m in _MATH_DELIMITER.finditer(text, begin):
        token = m.group()
        if opened is None and token in _CLOSER:
            opened = m
        elif opened is not None and token == _CLOSER[opened.group()]:
            spans.append((opened.start(), m.end(), text[opened.end() : m.start()]))
            opened = None
    return spans


def _tail(text: str) -> int:
    """Where the last ``_TAIL_CHARS`` characters begin, moved past a math span or a number that
    crosses that point. The fallbacks read only this tail: the final answer is at the end, and a
    megabyte of numbers or ``$`` costs no more than the tail's worth."""
    begin = max(0, len(text) - _TAIL_CHARS)
    if not begin:
        return 0
    if (text.count("$", 0, begin) - text.count("\\$", 0, begin)) % 2:  # inside $...$
        begin = text.find("$", begin) + 1 or len(text)
    for opener, closer in (("\\(", "\\)"), ("\\[", "\\]")):
        if text.count(opener, 0, begin) > text.count(closer, 0, begin):
            begin = text.find(closer, begin) + len(closer) if closer in text[begin:] else len(text)
    while begin < len(text) and (text[begin].isdigit() or text[begin] in ".,"):
        begin += 1
    return begin


def _numbers(text: str, rx: re.Pattern, source: str) -> list[Extraction]:
    return _answers(((m.start(), m.end(), [m.group()]) for m in rx.finditer(text, _tail(text))), source)


def _lenient(text: str) -> list[Extraction]:
    """The last math span (chained like boxes) or the last number outside spans, whichever is later."""
    spans = _math_spans(text, _tail(text))
    chains = _chains(spans, text, LENIENT_SOURCE)
    inside = [(s, e) for s, e, _ in spans]
    numbers = [n for n in _numbers(text, _EXPRESSION_NUMBER, LENIENT_SOURCE) if not _within(n, inside)]
    return sorted(chains + numbers, key=lambda a: a.start)


def _within(answer: Extraction, spans: list[tuple[int, int]]) -> bool:
    i = bisect.bisect_right(spans, (answer.start, float("inf"))) - 1
    return i >= 0 and spans[i][0] <= answer.start < spans[i][1]


def extract_answer(
    text: str,
    sources: Sequence[str] = ("boxed", "answer"),
    *,
    lenient: bool = False,
    skip: Callable[[Extraction], bool] | None = None,
) -> Extraction:
    """The final answer (see the module docstring for which one wins); ``Extraction()`` if none.

    :param sources: the anchored formats to look for; their order breaks ties between answers at
        the same place (``The answer is \\boxed{4}`` is a box).
    :param lenient: with no anchored answer, take the last math span or number.
    :param skip: answers for which it returns True are passed over (the domains skip answers
        copied from the prompt).
    """
    skipped = skip or (lambda a: False)
    for answer, _tier in reversed(_anchored(text, sources)):
        if not skipped(answer):
            return answer
    numbers = _numbers(text, _LAST_NUMBER, "last_number") if "last_number" in sources else []
    for fallback in (numbers, _lenient(text) if lenient else []):
        for answer in reversed(fallback):
            if not skipped(answer):
                return answer
    return Extraction()


_WRAPPERS = [("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("`", "`"), ('"', '"'), ("“", "”")]
_UNWRAP_CHARS = 10_000


def clean_answer(answer: str) -> str:
    """Strip what surrounds an answer: math delimiters, markdown bold, an inner box, a final period.

    At most eight layers are removed, and none from a text longer than ``_UNWRAP_CHARS``: no answer
    is wrapped deeper or is that long (but a plain number, which has no wrapping), and each layer
    costs a pass over the text.
    """
    s = answer.strip()
    changed, rounds = len(s) <= _UNWRAP_CHARS, 0
    while changed and s and rounds < 8:
        changed, rounds = False, rounds + 1
        s = s.rstrip(" .。")
        if s.strip("*") != s:  # markdown bold around or beside the answer ("**42**.", "42**")
            s, changed = s.strip("*").strip(), True
        for left, right in _WRAPPERS:
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s, changed = s[len(left) : len(s) - len(right)].strip(), True
        if s.startswith(("\\boxed", "\\fbox")):
            inner = find_boxed(s)
            if len(inner) == 1 and inner[0][0] == 0 and inner[0][1] == len(s):
                s, changed = inner[0][2].strip(), True
    return s


def split_alternatives(answer: str) -> list[str]:
    """``"1 or 2"`` -> ``["1", "2"]``; a single answer, or ``x<1 or x>3`` (a union), stays whole."""
    s = _TEXT_OR.sub(" or ", answer)
    parts = [p.strip(" ,;$") for p in _OR_SPLIT.split(s)]
    parts = [p for p in parts if p]
    if len(parts) < 2 or any(_RELATION.search(p) for p in parts):
        return [answer]
    return parts


def split_top_level(s: str) -> list[str]:
    """Split on commas (and ``\\text{ and }``) that are outside brackets: ``"1, (2,3)"`` -> 2 items."""
    s = re.sub(r"\\text\s*\{\s*and\s*\}|\band\b", ",", s)
    items, depth, cur = [], 0, []
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s) and s[i + 1] in "{}":
            depth += 1 if s[i + 1] == "{" else -1
            cur.append(s[i : i + 2])
            i += 2
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            items.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    items.append("".join(cur).strip())
    return [x for x in items if x]
