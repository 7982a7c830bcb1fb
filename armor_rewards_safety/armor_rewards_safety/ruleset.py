"""Refusal rules as data: loading the per-language phrase lists and compiling them to regexes.

The lists live in ``rules/<lang>.txt`` (format documented at the top of ``rules/en.txt``); users add
their own files through the domains' ``extra_rules`` parameter. Rules are literal phrases, never
user-written regexes, so every compiled pattern is an alternation of fixed strings with bounded
gaps: matching is linear in the response length and cannot backtrack catastrophically, which is
what lets the ``refusal`` and ``safety`` domains run in the trainer's own process.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Pattern

__all__ = ["SECTIONS", "RuleSet", "available_languages", "load_rules", "normalize", "parse_rules"]

RULES_DIR = Path(__file__).parent / "rules"
SECTIONS = (
    "refusal",
    "refusal_start",
    "refusal_opening",
    "subject",
    "filler",
    "action",
    "not_refusal",
    "apology",
    "redirection",
    "judgemental",
    "moralising",
    "compliance",
    "closing",
    "deflection",
    "comply_anyway",
    "jailbreak_setup",
    "safe_alternative",
)

_QUOTES = str.maketrans(
    {
        "‘": "'",
        "’": "'",
        "‚": "'",
        "‛": "'",
        "′": "'",
        "“": '"',
        "”": '"',
        "„": '"',
        "‟": '"',
        "″": '"',
        "—": " ",
        "–": " ",
        "…": "...",
        "\u200b": None,
        "\u200c": None,
        "\u200d": None,
        "\ufeff": None,
    }
)
_WHOLE = {
    "won't": "will not",
    "can't": "cannot",
    "shan't": "shall not",
    "i'm": "i am",
    "let's": "let us",
    "it's": "it is",
    "that's": "that is",
    "here's": "here is",
    "there's": "there is",
    "what's": "what is",
    "this's": "this is",
}
_SUFFIX = {"n't": " not", "'re": " are", "'ve": " have", "'ll": " will"}
# one pass over the text: whole words first ("won't" is not "wo" + "n't"), then suffixes ("don't" -> "do not");
# "'d" only after a pronoun ("I'd"), since "'d" elsewhere may be a possessive or "had"
_CONTRACTION = re.compile(
    r"\b(?:" + "|".join(map(re.escape, _WHOLE)) + r"|(?:i|you|we|they|he|she)'d)\b|n't\b|'re\b|'ve\b|'ll\b"
)


def _expand(m: re.Match) -> str:
    word = m.group(0)
    if word in _WHOLE:
        return _WHOLE[word]
    return word[:-2] + " would" if word.endswith("'d") else _SUFFIX[word]


_CAN_NOT = re.compile(r"\bcan not\b")
_SPACES = re.compile(r"[^\S\n]+")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


def normalize(text: str) -> str:
    """Lower case, NFKC (full-width -> half-width), straight quotes, dashes as spaces, no zero-width
    characters, expanded contractions, single spaces."""
    t = _SPACES.sub(" ", unicodedata.normalize("NFKC", str(text)).translate(_QUOTES).lower())
    if "'" in t:
        t = _CONTRACTION.sub(_expand, t)
    if "can not" in t:
        t = _CAN_NOT.sub("cannot", t)
    return t.strip()


def parse_rules(text: str, source: str = "<rules>") -> dict[str, list[str]]:
    """``[section]`` headers and one phrase per line; ``#`` comments; phrases normalized."""
    out: dict[str, list[str]] = {}
    section = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if not raw.strip().startswith("```") else raw.strip()
        if not line:
            continue
        header = re.fullmatch(r"\[\s*(\w+)\s*\]", line)
        if header:
            section = header.group(1)
            if section not in SECTIONS:
                raise ValueError(f"{source}:{n}: unknown section [{section}]; sections are {', '.join(SECTIONS)}")
            continue
        if section is None:
            raise ValueError(f"{source}:{n}: phrase {line!r} before any [section] header")
        out.setdefault(section, []).append(normalize(line))
    return out


def available_languages() -> list[str]:
    return sorted(p.stem for p in RULES_DIR.glob("*.txt"))


_WORD = re.compile(r"[a-z0-9_]")


def _trie(phrases: Iterable[str]) -> str:
    """A regex matching any of ``phrases``, as a character trie: a failing position is rejected after
    one character instead of after trying every phrase (hundreds of alternatives were ~1 ms a row)."""
    root: dict = {}
    for phrase in phrases:
        node = root
        for ch in phrase:
            node = node.setdefault(ch, {})
        node[""] = phrase

    def emit(node: dict) -> str:
        alts = [
            (r"\s+" if ch == " " else re.escape(ch)) + emit(child)
            for ch, child in sorted((k, v) for k, v in node.items() if k)
        ]
        if "" in node:  # a phrase ends here: after any longer continuation, so the longest phrase wins
            alts.append(r"(?![a-z0-9_])" if _WORD.match(node[""][-1]) else "")
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    return emit(root)


def _alternation(phrases: Iterable[str]) -> str:
    unique = set(p for p in phrases if p)
    latin = [p for p in unique if _WORD.match(p)]  # whole words: not inside a longer word
    other = [p for p in unique if not _WORD.match(p)]  # Chinese has no word boundaries
    parts = ([rf"(?<![a-z0-9_]){_trie(latin)}"] if latin else []) + ([_trie(other)] if other else [])
    return "(?:" + "|".join(parts) + ")" if parts else r"(?!x)x"


def _split_script(phrases: Iterable[str]) -> tuple[list[str], list[str]]:
    phrases = list(phrases)
    return [p for p in phrases if not _CJK.search(p)], [p for p in phrases if _CJK.search(p)]


@dataclass(frozen=True)
class RuleSet:
    """Compiled rules. Every pattern is searched on ``normalize``-d text."""

    phrases: dict[str, tuple[str, ...]]
    refusal: Pattern[str]
    refusal_start: Pattern[str]
    refusal_opening: Pattern[str]
    inability: Pattern[str]
    subject_end: Pattern[str]
    not_refusal: Pattern[str]
    apology: Pattern[str]
    redirection: Pattern[str]
    judgemental: Pattern[str]
    moralising: Pattern[str]
    compliance: Pattern[str]
    closing: Pattern[str]
    deflection: Pattern[str]
    comply_anyway: Pattern[str]
    jailbreak_setup: Pattern[str]
    safe_alternative: Pattern[str]

    @classmethod
    def build(cls, sections: dict[str, list[str]]) -> RuleSet:
        get = lambda name: sections.get(name, [])  # noqa: E731
        (subj_l, subj_c), (fill_l, fill_c), (act_l, act_c) = (
            _split_script(get(s)) for s in ("subject", "filler", "action")
        )
        # "I cannot, in good conscience, help": up to three filler words between subject and action
        latin = rf"{_alternation(subj_l)}(?:[\s,]+{_alternation(fill_l)}){{0,3}}[\s,]+{_alternation(act_l)}"
        cjk = rf"{_alternation(subj_c)}(?:\s*{_alternation(fill_c)}){{0,2}}\s*{_alternation(act_c)}"
        compiled = {
            name: re.compile(_alternation(get(name)))
            for name in (
                "refusal",
                "refusal_opening",
                "not_refusal",
                "apology",
                "redirection",
                "judgemental",
                "moralising",
                "compliance",
                "closing",
                "deflection",
                "comply_anyway",
                "jailbreak_setup",
                "safe_alternative",
            )
        }
        return cls(
            phrases={k: tuple(v) for k, v in sections.items()},
            refusal_start=re.compile(_alternation(get("refusal_start"))),
            inability=re.compile(f"{latin}|{cjk}"),
            # "I'm sorry, I can't." - a subject that ends its sentence
            subject_end=re.compile(rf"{_alternation(get('subject'))}\s*(?:[.!。!]|$)"),
            **compiled,
        )

    def mask(self, text: str) -> str:
        """Blank out ``not_refusal`` phrases ("i cannot wait") so that no rule sees their words."""
        return self.not_refusal.sub(lambda m: " " * len(m.group(0)), text)


def _read(path: Path) -> dict[str, list[str]]:
    return parse_rules(path.read_text(encoding="utf-8"), str(path))


@functools.lru_cache(maxsize=32)
def load_rules(languages: tuple[str, ...] | None = None, extra_rules: tuple[str, ...] = ()) -> RuleSet:
    """The built-in rules of ``languages`` (default: all, i.e. en and zh) plus the ``extra_rules`` files."""
    langs = languages if languages is not None else tuple(available_languages())
    merged: dict[str, list[str]] = {}
    files = []
    for lang in langs:
        path = RULES_DIR / f"{lang}.txt"
        if not path.is_file():
            raise ValueError(
                f"no built-in refusal rules for language {lang!r}; available: {', '.join(available_languages())}"
            )
        files.append(path)
    for extra in extra_rules:
        path = Path(extra).expanduser()
        if not path.is_file():
            raise ValueError(f"extra_rules file {str(path)!r} does not exist")
        files.append(path)
    for path in files:
        for section, phrases in _read(path).items():
            merged.setdefault(section, []).extend(phrases)
    return RuleSet.build(merged)
