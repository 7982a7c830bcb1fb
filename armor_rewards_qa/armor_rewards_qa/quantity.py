"""Numbers with an optional unit in an answer, and when two of them are the same quantity.

A number is written with digits (``5``, ``-2.5``, ``1,000``, ``.5``, ``3e8``, ``3×10^8``, ``10⁸``), with a
multiplier (``2.5 million``, ``2100万``, ``1.5亿``), or in Chinese numerals (``三百六十五``,
``两千一百万``, ``一九四五``). A unit follows it (``5 km``, ``5km``, ``8848米``, ``100 °C``,
``62 mph``) or, for a currency sign, precedes it (``$5``). Units are those of ``units.py``.

Two quantities are the same when:

- either has no unit: their numbers are close (``365天`` answers ``365``; ``50%`` answers ``50``);
- ``convert`` (the domain's ``units: true``): their units have one dimension and their values in SI
  are close (``5 km`` = ``5000 m``; ``100 °C`` = ``212 °F``, compared in kelvin);
- otherwise: they have the same unit, under any of its names (``5 km`` = ``5 kilometres``).

"Close" is ``math.isclose`` with the domain's ``rel_tol`` and ``abs_tol``, never tighter than a
relative 1e-9, so that a conversion's float rounding (``0.3048 * 10``) does not make a difference.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass

from armor_rewards_qa.units import UNITS, Unit

__all__ = ["Quantity", "find_quantities", "parse_quantity", "parse_zh_number", "same_quantity"]

_ZH_DIGITS = {
    "零": 0,
    "〇": 0,
    "一": 1,
    "二": 2,
    "两": 2,
    "三": 3,
    "四": 4,
    "五": 5,
    "六": 6,
    "七": 7,
    "八": 8,
    "九": 9,
}
_ZH_SMALL = {"十": 10, "百": 100, "千": 1000}
_ZH_CHARS = "".join(_ZH_DIGITS) + "十百千万亿"
_MULTIPLIERS = {
    "thousand": 1e3,
    "million": 1e6,
    "billion": 1e9,
    "trillion": 1e12,
    "千万": 1e7,
    "百万": 1e6,
    "万": 1e4,
    "亿": 1e8,
    "千": 1e3,
}
_SUPERSCRIPTS = str.maketrans(
    {"⁰": "0", "¹": "1", "²": "2", "³": "3", "⁴": "4", "⁵": "5", "⁶": "6", "⁷": "7", "⁸": "8", "⁹": "9", "⁻": "-"}
)
_SUPERSCRIPT_RUN = re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹⁻]+")
_NUMBER = re.compile(
    r"(?<![A-Za-z0-9_.])(?:(?P<arabic>[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[+-]?\.\d+)(?:e(?P<exp>[+-]?\d+))?"
    r"(?:\s*[x×*·]\s*10\s*\^\s*\(?\s*(?P<pow>[+-]?\d+)\s*\)?|\s*\^\s*\(?\s*(?P<caret>[+-]?\d+)\s*\)?)?"
    rf"|(?P<zh>[{_ZH_CHARS}]+))",
    re.IGNORECASE,
)
_MULTIPLIER = re.compile(r"\s*(thousand|million|billion|trillion|千万|百万|万|亿|千)(?![a-z])", re.IGNORECASE)
_UNIT = re.compile(
    r"\s*("
    + "|".join(
        re.escape(n) + (r"(?![a-z])" if n[-1].isascii() and n[-1].isalnum() else "")
        for n in sorted(UNITS, key=len, reverse=True)
    )
    + ")",
    re.IGNORECASE,
)
_CURRENCY_SIGN = re.compile(r"([$€£¥])\s?$")
# about 5 km, ~5 km, 约8849米, 8849米左右
_APPROX = re.compile(
    r"^(?:about|approximately|approx\.?|around|roughly|nearly|almost|some|over|~|≈|约|大约|大概|将近|接近|近)\s*"
    r"|\s*(?:左右|上下|多)$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Quantity:
    """A number and its unit (None for a bare number)."""

    value: float
    unit: Unit | None = None

    @property
    def si(self) -> float:
        return self.value if self.unit is None else self.value * self.unit.factor + self.unit.offset


def parse_zh_number(text: str) -> int | None:
    """A number in Chinese numerals (``三百六十五`` 365, ``十万`` 100000, ``一九四五`` 1945); None if it is not one."""
    if (
        not text
        or any(ch not in _ZH_CHARS for ch in text)
        or not any(ch in _ZH_DIGITS or ch in _ZH_SMALL for ch in text)
    ):
        return None
    if all(ch in _ZH_DIGITS for ch in text):
        if len(text) == 1:
            return _ZH_DIGITS[text]
        return int("".join(str(_ZH_DIGITS[ch]) for ch in text))  # read digit by digit: 一九四五
    total = wan = section = digit = 0
    for ch in text:
        if ch in _ZH_DIGITS:
            digit = _ZH_DIGITS[ch]
        elif ch in _ZH_SMALL:
            section += (digit or 1) * _ZH_SMALL[ch]  # 十 alone is ten
            digit = 0
        elif ch == "万":
            wan += (section + digit) * 10_000
            section = digit = 0
        else:  # 亿
            total = (total + wan + section + digit) * 100_000_000
            wan = section = digit = 0
    return total + wan + section + digit


def _number(m: re.Match) -> float | None:
    if m.group("zh") is not None:
        n = parse_zh_number(m.group("zh"))
        return None if n is None else float(n)
    try:
        value = float(m.group("arabic").replace(",", ""))
        if m.group("exp"):
            value *= 10.0 ** int(m.group("exp"))
        if m.group("pow"):
            value *= 10.0 ** int(m.group("pow"))
        if m.group("caret"):
            value **= int(m.group("caret"))
    except (OverflowError, ZeroDivisionError, ValueError):  # 10^400, 0^-1: no number an answer means
        return None
    return value if isinstance(value, float) and math.isfinite(value) else None


def _prepare(text: str) -> str:
    # before NFKC, which would read 10⁸ as 108: a run of superscripts is an exponent (10^8, m^2)
    text = _SUPERSCRIPT_RUN.sub(lambda m: "^" + m.group().translate(_SUPERSCRIPTS), text)
    return unicodedata.normalize("NFKC", text.replace("℃", "°C").replace("℉", "°F"))


def _read_at(text: str, m: re.Match) -> tuple[Quantity, int] | None:
    """The quantity whose number ``m`` matched, and where it ends (after multiplier and unit)."""
    value = _number(m)
    if value is None:
        return None
    end, unit = m.end(), None
    u = _UNIT.match(text, end)
    if u is None and m.group("zh") is None:
        mult = _MULTIPLIER.match(text, end)
        if mult is not None:  # after trying units: 5千米 is 5 km, 5千元 is 5000 元
            value *= _MULTIPLIERS[mult.group(1).lower()]
            end = mult.end()
            u = _UNIT.match(text, end)
    if u is not None and not (u.group(1) == "k"):  # lowercase k: five thousand more often than kelvin
        unit, end = UNITS[u.group(1).lower()], u.end()
    sign = _CURRENCY_SIGN.search(text[max(0, m.start() - 2) : m.start()])
    if unit is None and sign is not None:
        unit = UNITS[sign.group(1)]
    return Quantity(value, unit), end


def parse_quantity(text: str) -> Quantity | None:
    """``text`` as one quantity, nothing else but "about"-like words around it; None otherwise."""
    text = _prepare(text).strip()
    for _ in range(2):
        text = _APPROX.sub("", text).strip()
    sign = re.match(r"[$€£¥]\s*", text)
    start = sign.end() if sign else 0
    m = _NUMBER.match(text, start)
    if m is None or m.end() == m.start():
        return None
    read = _read_at(text, m)
    if read is None or read[1] != len(text.rstrip(" .")):
        return None
    return read[0]


def find_quantities(text: str, limit: int | None = None) -> list[Quantity]:
    """Every number in ``text`` (the first ``limit``), each with the unit that follows it.

    Chinese numerals count only where no number is written in digits: in running Chinese text they
    are as often words (一年有365天 states one number, 365).
    """
    text = _prepare(text)
    found = []
    matches = [m for m in _NUMBER.finditer(text) if m.end() > m.start()]
    if any(m.group("zh") is None for m in matches):
        matches = [m for m in matches if m.group("zh") is None]
    for m in matches[:limit]:
        read = _read_at(text, m)
        if read is not None:
            found.append(read[0])
    return found


def same_quantity(a: Quantity, b: Quantity, *, convert: bool, rel_tol: float = 0.0, abs_tol: float = 0.0) -> bool:
    """Whether ``a`` and ``b`` are the same quantity (see the module docstring)."""
    rel_tol = max(rel_tol, 1e-9)
    if a.unit is None or b.unit is None:
        return math.isclose(a.value, b.value, rel_tol=rel_tol, abs_tol=abs_tol)
    if convert:
        return a.unit.dimension == b.unit.dimension and math.isclose(a.si, b.si, rel_tol=rel_tol, abs_tol=abs_tol)
    return a.unit.symbol == b.unit.symbol and math.isclose(a.value, b.value, rel_tol=rel_tol, abs_tol=abs_tol)
