"""Which option a multiple-choice response chose: the anchoring rules of ``multiple_choice``.

The response is read after NFKC (``（Ｂ）`` is ``(B)``) with markdown emphasis dropped. An answer is
a *letter list*, one or more option letters (``B``, ``(B)``, ``option B``, ``AC``, ``A and C``,
``A、C``, ``A or B``), or, where the response quotes an option instead of its letter, the option's
text. The reader looks, in this order, for:

1. **an answer statement**: "Answer: B", "the (correct|best|final) answer/option is B", "my choice
   is B", ``\\boxed{B}``, "答案：B", "答案是/为 B", "正确答案/选项是 B", "选B", "故选 B", "选择 B",
   "答：B"; after the statement's words comes a letter list, or an option's text ("The answer is
   Mars", "答案是北京"). **The last statement in the response wins**, so a model may change its
   mind ("the answer is C. Wait, no: ... the answer is B" chooses B);
2. only without one, **a weaker statement**, last one winning: "I'd go with B", "I choose B",
   "it's B", "B is correct", "B is the right answer", "B选项正确", "是B";
3. only without either, **the end of the response**: a last line that is a letter list alone or
   an option label ("B", "**B**", "(B) Mars", "C. Carbon dioxide", "选项C"); a last line ending
   "..., so B." / "... option C." / "...: B"; else a last line that names exactly one option's
   text ("It was written by Jane Austen.").

A statement is passed over when it is negated ("the answer is not A", "不选A", "答案不是A"),
hypothetical ("if the answer were A", "如果选A就错了"), names a letter that is not an option
("Answer: E" with options A-D), or is copied from the prompt: the 64 characters of the response
that end with it appear verbatim in the prompt (a few-shot example's "Answer: B" repeated; the
rule of the math pack's ``echoed``).

Several letters joined by "or" (``A or B``, ``A或B``, ``A还是B``), and a response that lists every
option label line by line with no statement choosing one, are alternatives: ``read_choice`` marks
them, and the domain scores them as hedging; so is a last line that names every option's text.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from armor_rewards_qa.text import normalize

__all__ = ["Choice", "letters_in_prompt", "parse_options", "read_choice"]

_ECHO_CHARS = 64  # as in armor_rewards_math: a copied passage this long rarely matches by chance
_WINDOW = 300  # characters read around a statement: its clause, an option's text
_MAX_STATEMENTS = 64  # statements read back from the end: past that, a response is padding, not answering
_MARKDOWN = re.compile(r"\*\*|__|`")
_OPEN, _CLOSE = r"[(\[{【「<\"'“‘]", r"[)\]}】」>\"'”’]"
_ITEM = re.compile(
    rf"\s*(?:(?:option|choice|letter|选项)\s*)?(?P<open>{_OPEN}?)\s*(?P<run>[A-Za-z]+)(?![A-Za-z])\s*(?P<close>{_CLOSE}?)",
    re.I,
)
_AND = re.compile(r"\s*(?:,|、|;|&|\+|\band\b|\bplus\b|以及|和|与|及)\s*", re.I)
_OR = re.compile(r"\s*(?:\bor\b|或者|或是|或|还是|/|\|)\s*", re.I)
_EITHER = re.compile(r"\s*(?:either|both|neither)\b", re.I)
_SENTENCE_END = re.compile(r"(?<!\d)[.!?](?!\d)|[。！？;；\n]")
_CLAUSE_START = re.compile(r"[.!?;；。！？，,\n]")
_HYPOTHETICAL = re.compile(
    r"\b(?:if|suppose|supposing|assume|assuming|whether|unless|were)\b|如果|假如|假设|倘若|要是|若", re.I
)
_NEGATION = re.compile(r"(?:\bnot|\bnever|\bno|n t|不是|不|非|排除)\s*$")  # just before a quoted option: "not Venus"
_NEGATED_TEXT = re.compile(r"^(?:not|never|no|isn t|不|不是|并非|非)\b|^不", re.I)
_VERB = r"(?:[:：=]|\bis\b|\bare\b|\bwould\s+be\b|\bshould\s+be\b|\bmust\s+be\b|\bwill\s+be\b|\bseems\s+to\s+be\b)"
_FILLER = r"(?:\s*(?:therefore|thus|so|then|definitely|clearly|probably|likely|indeed|simply|I\s+think|I\s+believe)\b)*[\s:：=]*"  # noqa: E501 (one regular expression)
_LIST = (
    rf"(?<![A-Za-z])(?:{_OPEN}?[A-Z]{{1,10}}{_CLOSE}?)(?:\s*(?:,|、|and|和|与|及|&)\s*{_OPEN}?[A-Z]{_CLOSE}?){{0,25}}"
)

_STRONG = [
    re.compile(p, re.I)
    for p in (
        rf"\b(?:final\s+|correct\s+|right\s+|best\s+)?answers?\s*(?:\([^)]{{0,20}}\))?\s*{_VERB}{_FILLER}",
        rf"\b(?:correct|right|best|final)\s+(?:options?|choices?|letters?|selections?)\s*{_VERB}{_FILLER}",
        rf"\bmy\s+(?:final\s+)?(?:choice|pick|selection)\s*{_VERB}{_FILLER}",
        r"\\boxed\s*\{\s*(?:\\text(?:bf|rm)?\s*\{)?",
        r"答案\s*(?:应该|应当|应|就|可能|即|也)?\s*(?:是|为|選|选)?\s*[:：]?",
        r"正确(?:的)?(?:答案|选项)\s*(?:应该|应)?\s*(?:是|为)?\s*[:：]?",
        r"(?<![不没非])(?<!不能)(?<!不应)(?<!不会)(?<!不要)(?<!不可)选(?:择)?(?!项)\s*[:：]?",
        r"答(?!案)\s*[:：]",
    )
]
_WEAK = [
    re.compile(p, re.I)
    for p in (
        r"\bI(?:'d|'ll|\s+would|\s+will|\s+should)?\s+(?:choose|pick|select|go\s+with|go\s+for|opt\s+for)\s*",
        r"\b(?:it|that)(?:'s|\s+is|\s+must\s+be|\s+should\s+be|\s+would\s+be)\s+",
        r"(?<![不])(?:应该|应当|肯定|一定|就)?是\s*",
    )
]
_WEAK_BEFORE = [
    re.compile(p, re.I)
    for p in (  # the letters come before the words
        rf"(?P<items>{_LIST})\s*(?:is|are|seems|would\s+be|should\s+be)\s+(?:the\s+)?(?:correct|right|best|true)\b",
        rf"\b(?:option|choice)s?\s+(?P<items>{_LIST})\s+(?:is|are)\s+(?:the\s+)?(?:correct|right|best)\b",
        rf"(?P<items>{_LIST})\s*(?:选项|项)?\s*(?:是)?\s*(?:正确|对)",
        rf"选项\s*(?P<items>{_LIST})\s*(?:是)?\s*(?:正确|对)",
    )
]
_LABEL_LINE = re.compile(rf"^\W*{_OPEN}?(?P<letter>[A-Z])\s*(?:{_CLOSE}|[.:：、])")
_END_CUE = re.compile(
    r"(?:\bis|'s|\bso|\bthus|\bhence|\btherefore|\boption|\bchoice|[:：=]|->|→|=>|选项|是|为)\s*$", re.I
)


@dataclass(frozen=True)
class Choice:
    """What a response chose.

    :param letters: the chosen option letters in the order written; empty when nothing was chosen.
    :param alternatives: the letters are offered as alternatives ("A or B", every option listed).
    :param source: ``statement``, ``weak`` (a weaker statement), ``end`` (the end of the response) or None.
    :param by_text: the answer quoted an option's text, not its letter.
    :param echoed: an answer statement copied from the prompt was passed over.
    """

    letters: tuple[str, ...] = ()
    alternatives: bool = False
    source: str | None = None
    by_text: bool = False
    echoed: bool = False


def parse_options(raw: Any, where: str = "extra['options']") -> dict[str, str]:
    """A row's options as ``{letter: text}``.

    ``raw`` is a mapping ``{"A": "Venus", "B": "Mars"}`` or a list ``["Venus", "Mars"]`` (lettered
    A, B, ... in order; a leading label that matches, such as ``"A. Venus"`` or ``"(A) Venus"``, is
    dropped), or the same as a JSON string. Letters are upper-cased.
    """
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{where} is a string but not JSON: {e}; give a mapping {{letter: text}} or a list of texts"
            ) from e
    if isinstance(raw, Mapping):
        items = [(str(k).strip().upper(), str(v)) for k, v in raw.items()]
    elif isinstance(raw, (list, tuple)):
        items = []
        for i, text in enumerate(raw):
            letter = chr(ord("A") + i)
            label = re.match(rf"^\s*[(\[]?{letter}\s*[.)\]:：、]\s*", str(text), re.I)
            items.append((letter, str(text)[label.end() :] if label else str(text)))
    else:
        raise ValueError(f"{where} must be a mapping {{letter: text}} or a list of texts, got {type(raw).__name__}")
    bad = [k for k, _ in items if not re.fullmatch(r"[A-Z]", k)]
    if bad or len(items) > 26:
        raise ValueError(f"{where}: option keys must be single letters A-Z, got {bad or len(items)}")
    return dict(items)


def letters_in_prompt(prompt: str) -> list[str]:
    """The option letters a prompt labels (``A.``, ``(B)``, ``C)``), when they run A, B, C, ... from A."""
    found = set(
        re.findall(r"(?<![A-Za-z0-9])[(\[]?([A-Z])\s*[.)\]:：、]\s*(?=\S)", unicodedata.normalize("NFKC", prompt))
    )
    letters = []
    for code in range(ord("A"), ord("Z") + 1):
        if chr(code) not in found:
            break
        letters.append(chr(code))
    return letters if len(letters) >= 2 else []


def _run_letters(m: re.Match, valid: set[str]) -> list[str] | None:
    run = m.group("run")
    bracketed = bool(m.group("open") or m.group("close"))
    if run.isupper() and set(run) <= valid and len(set(run)) == len(run):
        return list(run)
    if (
        len(run) == 1
        and run.upper() in valid
        and (bracketed or re.match(r"\s*(?:[.。!！]\s*)?$", m.string[m.end() : m.end() + 3]))
    ):
        return [run.upper()]  # lower case only bracketed or ending the text: "(b)", "Answer: b"
    return None


def _letter_list(text: str, pos: int, valid: set[str]) -> tuple[list[str], bool, int] | None:
    """The letter list starting at ``pos``: (letters, joined by "or", end) or None."""
    e = _EITHER.match(text, pos)
    pos = e.end() if e else pos
    m = _ITEM.match(text, pos)
    first = _run_letters(m, valid) if m else None
    if not first or m is None:
        return None
    letters, alternatives, end = first, False, m.end()
    for _ in range(26):  # a longer list is no answer, and reading on would cost time
        joint = _AND.match(text, end) or _OR.match(text, end)
        m = _ITEM.match(text, joint.end()) if joint else None
        more = _run_letters(m, valid) if m else None
        if not more or joint is None or m is None:
            return letters, alternatives, end
        alternatives |= bool(_OR.fullmatch(joint.group()))
        letters, end = letters + [x for x in more if x not in letters], m.end()
    return letters, alternatives, end


def _option_texts(clause: str, options: Mapping[str, str]) -> tuple[list[str], bool, set[str]]:
    """Options whose text ``clause`` quotes: the first one and any joined to it by "and" or "or",
    whether "or" joined them, and every option the clause names (not after a negation)."""
    norm = normalize(clause)
    if not norm or _NEGATED_TEXT.match(norm):
        return [], False, set()
    spans = []
    for letter, text in options.items():
        key = normalize(text)
        if key:
            pattern = (
                (r"(?<![a-z0-9])" if key[0].isascii() else "")
                + re.escape(key)
                + (r"(?![a-z0-9])" if key[-1].isascii() else "")
            )
            spans += [
                (m.start(), m.end(), letter)
                for m in re.finditer(pattern, norm)
                if not _NEGATION.search(norm, max(0, m.start() - 12), m.start())
            ]
    # a text inside a longer one's match is not quoted on its own ("Paris" inside "Paris, Texas")
    kept, reach = [], -1
    for span in sorted(spans, key=lambda s: (s[0], -s[1])):
        if span[1] > reach:
            kept.append(span)
            reach = span[1]
    spans = kept
    if not spans:
        return [], False, set()
    letters, alternatives, end = [spans[0][2]], False, spans[0][1]
    for start, stop, letter in spans[1:]:
        gap = norm[end:start].strip()
        if gap in ("or", "或", "或者", "还是", "either"):
            alternatives = True
        elif gap not in ("and", "和", "与", "及", "以及", ""):
            break
        if letter not in letters:
            letters.append(letter)
        end = stop
    return letters, alternatives, {s[2] for s in spans}


def _echoed(text: str, end: int, prompt: str) -> bool:
    return end >= _ECHO_CHARS and text[end - _ECHO_CHARS : end] in prompt


def _hypothetical(text: str, start: int) -> bool:
    before = text[max(0, start - _WINDOW) : start]
    clause = before[max((m.end() for m in _CLAUSE_START.finditer(before)), default=0) :]
    return bool(_HYPOTHETICAL.search(clause))


def _read_statement(
    text: str, m: re.Match, valid: set[str], options: Mapping[str, str], allow_text: bool
) -> tuple[Choice | None, int]:
    """What the statement ``m`` chose (None: nothing valid), and where it ends."""
    if "items" in m.re.groupindex:
        read = _letter_list(text, m.start("items"), valid)
        return (Choice(tuple(read[0]), read[1]) if read else None), m.end()
    read = _letter_list(text, m.end(), valid)
    if read:
        return Choice(tuple(read[0]), read[1]), read[2]
    if not (allow_text and m.re in _STRONG):
        return None, m.end()
    stop = _SENTENCE_END.search(text, m.end(), m.end() + _WINDOW)
    end = stop.start() if stop else min(len(text), m.end() + _WINDOW)
    letters, alternatives, _ = _option_texts(text[m.end() : end], options)
    return (Choice(tuple(letters), alternatives, by_text=True) if letters else None), end


def _last_statement(
    text: str,
    patterns: Sequence[re.Pattern],
    valid: set[str],
    options: Mapping[str, str],
    prompt: str,
    allow_text: bool,
) -> tuple[Choice | None, bool]:
    """The last statement made with ``patterns`` that chose something; and whether a later one was echoed.

    Read from the end, at most ``_MAX_STATEMENTS`` of them, so that the work stays linear in the
    response however many statements it holds.
    """
    echoed = False
    matches = sorted((m for p in patterns for m in p.finditer(text)), key=lambda m: m.start(), reverse=True)
    for m in matches[:_MAX_STATEMENTS]:
        if _hypothetical(text, m.start()):
            continue
        choice, end = _read_statement(text, m, valid, options, allow_text)
        if choice is None:
            continue
        if _echoed(text, end, prompt):
            echoed = True
            continue
        return choice, echoed
    return None, echoed


def _last_line(text: str) -> str:
    lines = [re.sub(r"^[\s>#*\-]+", "", line).strip() for line in text.splitlines()]
    return next((line for line in reversed(lines) if line), "")


def _from_the_end(text: str, valid: set[str], options: Mapping[str, str], allow_text: bool) -> Choice:
    labels = {
        m.group("letter")
        for line in text.splitlines()
        if (m := _LABEL_LINE.match(line.strip())) and m.group("letter") in valid
    }
    if len(labels) >= 2:  # the response lists options line by line: no bare label decides
        return Choice(tuple(sorted(labels)), True, "end") if labels == valid else Choice()
    line = _last_line(text)[-_WINDOW * 3 :].rstrip(" .。!！")
    read = _letter_list(line, 0, valid)
    if read and (
        read[2] == len(line)
        or re.match(r"\s*[.:：、)]|\s*(?:选项|项)$", line[read[2] :])
        or line[read[2] - 1] in ")]】"
    ):
        return Choice(tuple(read[0]), read[1], "end")
    for m in re.finditer(rf"{_LIST}$", line):
        if _END_CUE.search(line[: m.start()]):
            read = _letter_list(line, m.start(), valid)
            if read:
                return Choice(tuple(read[0]), read[1], "end")
    if allow_text:
        letters, alternatives, named = _option_texts(line, options)
        if len(named) == 1 or alternatives:  # one option named, or options offered as alternatives
            return Choice(tuple(letters), alternatives, "end", by_text=True)
        if named == valid:  # every option named: the options repeated, none chosen
            return Choice(tuple(sorted(named)), True, "end", by_text=True)
    for m in re.finditer(_LIST, line):  # "A or B, both possible": alternatives, not a choice
        read = _letter_list(line, m.start(), valid)
        if read and read[1]:
            return Choice(tuple(read[0]), True, "end")
    return Choice()


def read_choice(
    response: str,
    letters: Sequence[str],
    options: Mapping[str, str] | None = None,
    prompt: str = "",
    *,
    allow_text: bool = True,
    strict: bool = False,
) -> Choice:
    """The option ``response`` chose among ``letters`` (see the module docstring for the rules).

    :param options: ``{letter: text}``, for answers that quote an option's text.
    :param allow_text: accept an option's text in place of its letter.
    :param strict: only answer statements (rule 1) count.
    """
    text = _MARKDOWN.sub("", unicodedata.normalize("NFKC", response))
    prompt = _MARKDOWN.sub("", unicodedata.normalize("NFKC", prompt))
    valid, options = set(letters), dict(options or {})
    echoed = False
    tiers = [("statement", _STRONG)] if strict else [("statement", _STRONG), ("weak", _WEAK + _WEAK_BEFORE)]
    for source, patterns in tiers:
        choice, copied = _last_statement(text, patterns, valid, options, prompt, allow_text)
        echoed |= copied
        if choice is not None:
            return Choice(choice.letters, choice.alternatives, source, choice.by_text, echoed)
    if strict or echoed:  # a response whose last statement repeats the prompt has no answer of its own
        return Choice(echoed=echoed)
    end = _from_the_end(text, valid, options, allow_text)
    return Choice(end.letters, end.alternatives, end.source, end.by_text, echoed)
