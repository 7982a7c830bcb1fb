"""Plain numbers as people and models write them: exact parsing without sympy.

Most math answers (every GSM8K answer, most competition answers) are plain numbers. Deciding
``"$1,234.50"`` == ``"1234.5"`` with exact rational arithmetic takes microseconds and cannot hang,
so the ``gsm8k`` domain uses only this module and the ``math`` domain tries it before handing an
answer to math-verify (which parses LaTeX into sympy: milliseconds, and may hang).

What is understood: a sign; thousands separators (``1,234``, LaTeX ``1{,}234`` and ``1\\,234``);
decimals; integer fractions (``3/4``, ``\\frac{3}{4}``, ``\\dfrac34``); percentages (``50%``,
``50\\%``, ``50 percent``); a currency before the number (``$``, ``\\$``, ``€``, ``£``, ``¥``,
``USD`` ...); a unit after it (``5 cm``, ``5\\text{ cm}``, ``12 km/h``, ``30^\\circ``, ``5元``).
A letter glued to a number is a unit only when it is a known unit: ``5cm`` is 5, ``5x`` is not a
number at all (it is ``5*x``, and goes to the symbolic check).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

__all__ = ["Num", "parse_number", "numbers_equal", "strip_latex_noise"]


@dataclass(frozen=True)
class Num:
    """A parsed number. ``exact`` is False for decimals (``0.333`` may approximate ``1/3``)."""

    value: Fraction
    exact: bool = True
    percent: bool = False


# A relative tolerance only where a decimal is involved: math-verify rounds floats to 6 places,
# and 1/3 written as 0.333333 should match while 0.3333 should not.
REL_TOL = Fraction(1, 10**6)

_NUM = r"[+-]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
_CURRENCY = re.compile(r"^(?P<sign>[+-]?)\s*(?:US\$|\\\$|\$|€|£|¥|₹|₩|USD|EUR|GBP|RMB|CNY|Rs\.?)\s*")
_NUMBER = re.compile(rf"^(?P<num>{_NUM})(?P<rest>.*)$", re.S)
_FRACTION = re.compile(r"^(?P<sign>[+-]?)(?P<p>[+-]?\d+)\s*/\s*(?P<q>\d+)$")
_LATEX_FRACTION = re.compile(r"^(?P<sign>[+-]?)\\frac(?:\{\s*(?P<p>[+-]?\d+)\s*\}|(?P<p1>\d))(?:\{\s*(?P<q>\d+)\s*\}|(?P<q1>\d))$")
# units glued to the number ("5cm"); with a space between, any short run of words is a unit
_KNOWN_UNITS = {
    "m", "cm", "mm", "km", "nm", "g", "kg", "mg", "lb", "lbs", "oz", "s", "sec", "ms", "min", "mins", "h", "hr", "hrs",
    "ml", "l", "ft", "in", "mi", "yd", "mph", "kmh", "kph", "k", "st", "nd", "rd", "th", "cents", "dollars", "yuan",
}
_NOT_UNITS = {"or", "and", "plus", "minus", "times", "x", "y", "z", "n", "i", "e", "a", "b", "c", "pi", "to", "per"}
_CJK_NOT_UNITS = re.compile(r"或|和|到|至|加|减|乘|除|与")
_UNIT_WORD = re.compile(r"^[A-Za-z\u4e00-\u9fff]+\.?$")
_EXPONENT = re.compile(r"(?:\^\{?[23]\}?|[²³])$")

_TEXT_CMD = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox|operatorname)\s*\{([^{}]*)\}")
_NOISE = [
    (re.compile(r"\\left|\\right|\\displaystyle|\\!|\\[,;:> ]|~"), ""),
    (re.compile(r"\{,\}"), ","),
    (re.compile(r"\\%"), "%"),
    (re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree"), ""),
    (re.compile(r"[−–]"), "-"),
    (re.compile(r"\\[dt]frac"), r"\\frac"),
]


def strip_latex_noise(s: str) -> str:
    """Remove LaTeX that never changes a value: spacing, ``\\left``/``\\right``, ``\\text{}`` wrappers."""
    for pattern, repl in _NOISE:
        s = pattern.sub(repl, s)
    prev = None
    while prev != s:  # nested \text{\textbf{...}}
        prev, s = s, _TEXT_CMD.sub(r" \1 ", s)
    return s.strip()


def _is_unit(rest: str, glued: bool) -> bool:
    rest = _EXPONENT.sub("", rest.strip())
    words = [w for w in re.split(r"\s*(?:/|\bper\b)\s*|\s+", rest) if w]
    if not words or len(words) > 4:
        return False
    for i, w in enumerate(words):
        if not _UNIT_WORD.match(w) or w.lower() in _NOT_UNITS or _CJK_NOT_UNITS.search(w):
            return False
        if i == 0 and glued and w.isascii() and w.lower().rstrip(".") not in _KNOWN_UNITS:
            return False
    return True


def parse_number(text: str) -> Num | None:
    """``Num`` if ``text`` is one plain number (with the decorations above), else None.

    >>> parse_number("$1,234.50").value
    Fraction(2469, 2)
    >>> parse_number("5x") is None
    True
    """
    s = strip_latex_noise(str(text)).rstrip(".").strip()
    s = s.strip("$").strip() if s.count("$") == 2 and s.startswith("$") and s.endswith("$") else s
    m = _CURRENCY.match(s)
    if m:
        s = m.group("sign") + s[m.end():]
    s = s.replace(" ", " ").strip()
    for rx in (_FRACTION, _LATEX_FRACTION):
        f = rx.match(s)
        if f:
            p, q = int(f.group("p") or f.group("p1")), int(f.group("q") or f.group("q1"))
            if q == 0:
                return None
            value = Fraction(p, q)
            return Num(-value if f.group("sign") == "-" else value)
    m = _NUMBER.match(s)
    if not m:
        return None
    num, rest = m.group("num"), m.group("rest")
    percent = False
    if rest.strip():
        glued = not rest[0].isspace()
        rest = rest.strip()
        pm = re.match(r"^(%|percent|per\s*cent|pct)\.?", rest, re.I)
        if pm:
            percent, rest = True, rest[pm.end():].strip()
        if rest and not _is_unit(rest, glued and not percent):
            return None
    digits = num.replace(",", "")
    return Num(Fraction(digits), exact="." not in digits, percent=percent)


def _values(n: Num) -> list[Fraction]:
    # "50%" matches both 0.5 and 50: answers drop or keep the percent sign (math-verify does the same)
    return [n.value, n.value / 100] if n.percent else [n.value]


def numbers_equal(gold: Num, answer: Num) -> bool:
    """Exact equality; within ``REL_TOL`` when either side is a decimal."""
    for g in _values(gold):
        for a in _values(answer):
            if g == a:
                return True
            if not (gold.exact and answer.exact) and abs(g - a) <= REL_TOL * max(1, abs(g)):
                return True
    return False
