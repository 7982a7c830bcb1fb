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
number at all (it is ``5*x``, and goes to the symbolic check). A currency may also follow the
number (``2.74 $``, ``5 €``).

Numbers longer than ``EXACT_DIGITS`` digits are not converted (CPython refuses ``int()`` past 4,300
digits, and the conversion is quadratic): they keep a canonical digit string instead, and two such
numbers are equal when their digit strings are.

Decimal commas (``1,5``, ``2,74 $``) are read by ``read_decimal_commas`` according to the domains'
``decimal_separator`` parameter, before anything else looks at the text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

__all__ = [
    "DECIMAL_SEPARATORS",
    "EXACT_DIGITS",
    "Num",
    "parse_number",
    "numbers_equal",
    "read_decimal_commas",
    "strip_latex_noise",
]

#: Past this many digits a number is compared as a digit string, not converted (CPython's ``int()``
#: refuses more than 4,300 digits by default).
EXACT_DIGITS = 4000

DECIMAL_SEPARATORS = ("auto", "point", "comma")


@dataclass(frozen=True)
class Num:
    """A parsed number. ``exact`` is False for decimals (``0.333`` may approximate ``1/3``).

    ``value`` is None for a number too long to convert; ``digits`` then holds its canonical digit
    string (no leading zeros, no trailing decimal zeros), which is what it is compared by.
    """

    value: Fraction | None
    exact: bool = True
    percent: bool = False
    digits: str = ""


# A relative tolerance only where a decimal is involved: math-verify rounds floats to 6 places,
# and 1/3 written as 0.333333 should match while 0.3333 should not.
REL_TOL = Fraction(1, 10**6)

# thousands grouped by commas (1,234) or by spaces (1 234, as SI writes them; also no-break and thin spaces)
_SPACE_GROUPS = r"\d{1,3}(?:[ \u00a0\u202f\u2009]\d{3})+(?!\d)"
_NUM = rf"[+-]?(?:\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?|{_SPACE_GROUPS}(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
_CURRENCY = re.compile(r"^(?P<sign>[+-]?)\s*(?:US\$|\\\$|\$|€|£|¥|₹|₩|USD|EUR|GBP|RMB|CNY|Rs\.?)\s*")
_TRAILING_CURRENCY = re.compile(r"^(?:\\\$|\$|€|£|¥|₹|₩)\s*")
_NUMBER = re.compile(rf"^(?P<num>{_NUM})(?P<rest>.*)$", re.S)
_FRACTION = re.compile(r"^(?P<sign>[+-]?)(?P<p>[+-]?\d+)\s*/\s*(?P<q>\d+)$")
_LATEX_FRACTION = re.compile(
    r"^(?P<sign>[+-]?)\\frac(?:\{\s*(?P<p>[+-]?\d+)\s*\}|(?P<p1>\d))(?:\{\s*(?P<q>\d+)\s*\}|(?P<q1>\d))$"
)
# units glued to the number ("5cm"); with a space between, any short run of words is a unit
_KNOWN_UNITS = {
    "m",
    "cm",
    "mm",
    "km",
    "nm",
    "g",
    "kg",
    "mg",
    "lb",
    "lbs",
    "oz",
    "s",
    "sec",
    "ms",
    "min",
    "mins",
    "h",
    "hr",
    "hrs",
    "ml",
    "l",
    "ft",
    "in",
    "mi",
    "yd",
    "mph",
    "kmh",
    "kph",
    "k",
    "st",
    "nd",
    "rd",
    "th",
    "cents",
    "dollars",
    "yuan",
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


def _canonical(digits: str) -> str:
    """``"-007.50"`` -> ``"-7.5"``: the digit string that equal numbers share (zero is ``"0"``)."""
    whole, _, frac = digits.lstrip("+-").partition(".")
    out = (whole.lstrip("0") or "0") + ("." + frac.rstrip("0") if frac.rstrip("0") else "")
    return "-" + out if digits.startswith("-") and out != "0" else out


def _number(digits: str, **flags) -> Num:
    """A ``Num`` for a decimal string; past ``EXACT_DIGITS`` digits, its canonical digit string."""
    canonical = _canonical(digits)
    if len(canonical) <= EXACT_DIGITS:
        try:
            return Num(Fraction(canonical), **flags)
        except ValueError:  # sys.set_int_max_str_digits() set below our limit
            pass
    return Num(None, digits=canonical, **flags)


def _fraction(f: re.Match) -> Num | None:
    sign = "-" if f.group("sign") == "-" else ""
    p, q = _number(f.group("p") or f.group("p1")), _number(f.group("q") or f.group("q1"))
    if p.value is None or q.value is None:
        return Num(None, digits=f"{sign}{p.digits or p.value}/{q.digits or q.value}")
    if q.value == 0:
        return None
    return Num(-p.value / q.value if sign else p.value / q.value)


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
        s = m.group("sign") + s[m.end() :]
    s = s.replace(" ", " ").strip()
    for rx in (_FRACTION, _LATEX_FRACTION):
        f = rx.match(s)
        if f:
            return _fraction(f)
    m = _NUMBER.match(s)
    if not m:
        return None
    num, rest = m.group("num"), m.group("rest")
    percent = False
    if rest.strip():
        glued = not rest[0].isspace()
        rest = _TRAILING_CURRENCY.sub("", rest.strip())
        pm = re.match(r"^(%|percent|per\s*cent|pct)\.?", rest, re.I)
        if pm:
            percent, rest = True, rest[pm.end() :].strip()
        if rest and not _is_unit(rest, glued and not percent):
            return None
    digits = re.sub(r"[, \u00a0\u202f\u2009]", "", num)
    return _number(digits, exact="." not in digits, percent=percent)


def _values(n: Num) -> list[Fraction]:
    # "50%" matches both 0.5 and 50: answers drop or keep the percent sign (math-verify does the same)
    assert n.value is not None
    return [n.value, n.value / 100] if n.percent else [n.value]


def numbers_equal(gold: Num, answer: Num) -> bool:
    """Exact equality; within ``REL_TOL`` when either side is a decimal. Numbers too long to
    convert are equal only to each other, when their digit strings are the same."""
    if gold.value is None or answer.value is None:
        return gold.value is None and answer.value is None and gold.digits == answer.digits
    for g in _values(gold):
        for a in _values(answer):
            if g == a:
                return True
            if not (gold.exact and answer.exact) and abs(g - a) <= REL_TOL * max(1, abs(g)):
                return True
    return False


# A run of digits joined by points or commas: 1,5  1.234,56  1,234,567  1{,}5
_SEPARATED = re.compile(r"(?<![\d.,])\d+(?:[.,]\d+)+")
_POINT_GROUPS = re.compile(r"\d{1,3}(?:\.\d{3})+")


def _read_token(token: str, mode: str) -> str:
    head, comma, tail = token.rpartition(",")
    if not comma:  # 1.234.567 is a thousands-grouped integer where commas are decimal separators
        return token.replace(".", "") if mode == "comma" and _POINT_GROUPS.fullmatch(token) else token
    if "," in head or "." in tail:  # 1,234,567 or 1,2,3 (a list), and 1,234.5 (point decimal)
        return token
    if "." in head:  # 1.234,5: points group thousands, the comma is the decimal separator
        return head.replace(".", "") + "." + tail if _POINT_GROUPS.fullmatch(head) else token
    if mode == "auto" and len(tail) == 3 and not head.startswith("0"):  # 1,234 groups thousands; 0,111 cannot
        return token
    return head + "." + tail


def read_decimal_commas(text: str, mode: str = "auto") -> str:
    """Rewrite decimal commas as points: ``"2,74 $"`` -> ``"2.74 $"``.

    :param mode: ``point`` leaves the text alone (a comma separates thousands or list items);
        ``comma`` reads every lone comma between digits as a decimal separator and points between
        groups of three digits as thousands separators (``1.234,5`` -> ``1234.5``); ``auto`` does
        the same only where the whole text is then one plain number, and reads a comma followed by
        exactly three digits as a thousands separator (``1,234``), so that ``(1,5)`` stays a pair,
        unless the digits before it start with 0 (``0,111`` is 0.111: no thousands group starts so).
    """
    if mode not in DECIMAL_SEPARATORS:
        raise ValueError(f"decimal_separator={mode!r}: use one of {', '.join(DECIMAL_SEPARATORS)}")
    if mode == "point" or (mode == "auto" and "," not in text):
        return text
    plain = text.replace("{,}", ",")  # LaTeX's comma without the space after it, in both roles
    out = _SEPARATED.sub(lambda m: _read_token(m.group(), mode), plain)
    if out == plain or (mode == "auto" and parse_number(out) is None):
        return text
    return out
