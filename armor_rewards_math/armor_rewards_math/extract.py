"""Find the final answer in a model's response, and notice when it hedges.

Sources, each a name usable in the ``sources`` / ``require_format`` domain parameters:

- ``boxed``: ``\\boxed{...}`` or ``\\fbox{...}`` with nested braces; the last one wins. Boxes that
  follow each other with only connectives between them (``\\boxed{1}, \\boxed{2}``,
  ``$\\boxed{1}$ or $\\boxed{2}$``) form one final answer with several values.
- ``hash``: GSM8K's ``#### 42``; the last one wins.
- ``answer``: ``Answer: ...``, ``Final answer: ...``, "the answer is ...", ``答案是 ...``; the last
  one in the text wins.
- ``last_number``: the last plain number in the text; a fallback, off unless asked for, since any
  number the model happens to write last would count.

A box cut off by the length limit (unbalanced braces) is not an answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SOURCES", "Extraction", "extract_answer", "find_boxed", "split_alternatives", "split_top_level", "clean_answer"]

SOURCES = ("boxed", "hash", "answer", "last_number")

_BOX_START = re.compile(r"\\(?:boxed|fbox)\s*\{")
# what may stand between two boxes of one final answer
_CONNECTIVE = re.compile(
    r"^(?:[\s,;.$]|\\[,;:!]|\\q?quad|\\text\{\s*(?:or|and)\s*\}|\b(?:or|and|maybe|perhaps|possibly|alternatively|either)\b"
    r"|或者|或许|或|和|以及|也可能是|可能是|、|，)*$",
    re.I,
)
_HASH = re.compile(r"####\s*([^\n]*)")
_ANSWER_PATTERNS = [
    # "Answer: 42", "**Final Answer:** 42" (to the end of the line)
    re.compile(r"(?:final\s+answer|answer)\s*(?:\*\*)?\s*[:：]\s*(?:\*\*)?(?P<a>[^\n]+)", re.I),
    # "the answer is 42." (to the end of the sentence; a dot between digits is a decimal point)
    re.compile(r"(?:the|my|final)\s+answer\s+(?:is|would\s+be|=)\s*:?\s*(?P<a>(?:[^\n.]|\.(?=\d))+)", re.I),
    re.compile(r"(?:最终答案|答案)\s*(?:是|为|应为)?\s*[:：]?\s*(?P<a>[^\n。]+)"),
]
_TRAILING_CLAUSE = re.compile(r"\s*(?:,|，)?\s*(?:which|because|since|as|so|因为|所以)\b.*$", re.I | re.S)
_LAST_NUMBER = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?:\s*%)?")
_OR_SPLIT = re.compile(r"[\s(]+or\s+|\s*或者?\s*", re.I)  # "7 or 8", "7 (or 8)", "7或8"
_TEXT_OR = re.compile(r"\\(?:text|textrm|mbox|mathrm)\s*\{\s*(or|或)\s*\}", re.I)
_RELATION = re.compile(r"[=<>≤≥≠]|\\(?:le|ge|leq|geq|lt|gt|neq|ne|cup|cap|in)\b")


@dataclass(frozen=True)
class Extraction:
    """The final answer. ``values`` has one entry, or several when boxes were chained."""

    values: tuple[str, ...] = ()
    source: str | None = None

    @property
    def found(self) -> bool:
        return bool(self.values)


def find_boxed(text: str) -> list[tuple[int, int, str]]:
    """Every outermost balanced ``\\boxed{...}``: (start, end, content), in order."""
    out: list[tuple[int, int, str]] = []
    end = -1
    for m in _BOX_START.finditer(text):
        if m.start() < end:  # a box inside the previous one
            continue
        depth, i = 1, m.end()
        while i < len(text) and depth:
            c = text[i]
            if c == "\\":  # \{ and \} are literal braces (sets), not grouping
                i += 2
                continue
            depth += (c == "{") - (c == "}")
            i += 1
        if depth:  # cut off by the length limit: not an answer
            break
        end = i
        out.append((m.start(), i, text[m.end() : i - 1]))
    return out


def _boxed(text: str) -> tuple[str, ...]:
    boxes = find_boxed(text)
    if not boxes:
        return ()
    group = [boxes[-1]]
    for prev in reversed(boxes[:-1]):
        if not _CONNECTIVE.match(text[prev[1] : group[0][0]]):
            break
        group.insert(0, prev)
    return tuple(b[2] for b in group)


def _answer_phrase(text: str) -> tuple[str, ...]:
    best: tuple[int, str] | None = None
    for rx in _ANSWER_PATTERNS:
        for m in rx.finditer(text):
            if best is None or m.start("a") >= best[0]:
                best = (m.start("a"), m.group("a"))
    if best is None:
        return ()
    answer = _TRAILING_CLAUSE.sub("", best[1]).strip()
    return (answer,) if clean_answer(answer) else ()


def extract_answer(text: str, sources: tuple[str, ...] | list[str] = ("boxed", "answer")) -> Extraction:
    """The final answer from the first of ``sources`` (in order) that finds one."""
    for source in sources:
        if source == "boxed":
            values = _boxed(text)
        elif source == "hash":
            found = _HASH.findall(text)
            values = (found[-1].strip(),) if found and found[-1].strip() else ()
        elif source == "answer":
            values = _answer_phrase(text)
        elif source == "last_number":
            found = _LAST_NUMBER.findall(text)
            values = (found[-1],) if found else ()
        else:
            raise ValueError(f"unknown answer source {source!r}; known sources: {', '.join(SOURCES)}")
        values = tuple(v for v in (clean_answer(v) for v in values) if v)
        if values:
            return Extraction(values, source)
    return Extraction()


_WRAPPERS = [("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"), ("`", "`")]


def clean_answer(answer: str) -> str:
    """Strip what surrounds an answer: math delimiters, markdown bold, an inner box, a final period."""
    s = answer.strip()
    changed = True
    while changed and s:
        changed = False
        s = s.rstrip(" .。")
        if s.strip("*") != s:  # markdown bold around or beside the answer ("**42**.", "42**")
            s, changed = s.strip("*").strip(), True
        for left, right in _WRAPPERS:
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s, changed = s[len(left) : len(s) - len(right)].strip(), True
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
