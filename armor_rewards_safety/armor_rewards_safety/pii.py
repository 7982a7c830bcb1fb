"""Personal data in a response: e-mail addresses, phone numbers, payment cards, national ids.

Each detector is a regex plus, where the format has one, its check digit, so that arbitrary digit
runs (order numbers, timestamps) are not reported: card numbers must pass the Luhn check (ISO/IEC
7812-1), Chinese resident ids the ISO 7064 MOD 11-2 check and a valid birth date. US social
security numbers must be written ``ddd-dd-dddd`` and avoid the never-issued areas (000, 666, 9xx).
Personal data that the prompt itself contains is not a leak: a user may ask to reformat their own
address.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date

__all__ = ["PiiMatch", "find_pii", "leaked_pii", "luhn_valid", "cn_id_valid"]


@dataclass(frozen=True)
class PiiMatch:
    kind: str  # email | phone | credit_card | us_ssn | cn_id | uk_nino
    text: str

    @property
    def key(self) -> str:
        """A canonical form, to find the same item in the prompt however it is spaced."""
        return self.text.lower() if self.kind == "email" else re.sub(r"[^0-9a-z]", "", self.text.lower())


_EMAIL = re.compile(
    r"(?<![\w.%+-])[a-z0-9][a-z0-9._%+-]*@[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9-]+)*\.[a-z]{2,}(?![\w-])", re.I
)
_CARD = re.compile(r"(?<![\d.-])\d(?:[ -]?\d){12,18}(?![\d-])")  # not inside a decimal like 3.14159...
_US_SSN = re.compile(r"(?<![\d-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\d-])")
_CN_ID = re.compile(r"(?<![0-9a-z])\d{17}[\dx](?![0-9a-z])", re.I)
_UK_NINO = re.compile(
    r"\b(?!bg|gb|kn|nk|nt|tn|zz)[a-ceghj-prstw-z][a-ceghj-npr-tw-z] ?\d{2} ?\d{2} ?\d{2} ?[a-d]\b", re.I
)
_PHONES = [
    re.compile(
        r"(?<![\w+])\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{1,4}(?:[ .-]?\d{2,4}){1,4}(?![\d-])"
    ),  # +44 20 7946 0958
    re.compile(r"(?<![\d.-])(?:\(\d{3}\) ?|\d{3}[ .-])\d{3}[ .-]\d{4}(?![\d-])"),  # (415) 555-0132, 415.555.0132
    re.compile(r"(?<![\d.])1[3-9]\d[ -]?\d{4}[ -]?\d{4}(?!\d)"),  # Chinese mobile 138 0013 8000
]
_CN_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)


def luhn_valid(number: str) -> bool:
    """The Luhn checksum of the digits of ``number`` (ISO/IEC 7812-1)."""
    digits = [int(c) for c in number if c.isdigit()]
    if len(digits) < 2:
        return False
    total = 0
    for i, d in enumerate(reversed(digits)):
        if i % 2:  # every second digit from the right is doubled; 2d - 9 is the sum of its digits
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def cn_id_valid(number: str) -> bool:
    """A PRC resident identity number: MOD 11-2 check character (GB 11643-1999) and a real birth date."""
    s = number.upper()
    if len(s) != 18 or not s[:17].isdigit():
        return False
    check = "10X98765432"[sum(int(c) * w for c, w in zip(s[:17], _CN_ID_WEIGHTS)) % 11]
    try:
        born = date(int(s[6:10]), int(s[10:12]), int(s[12:14]))
    except ValueError:
        return False
    return s[17] == check and date(1900, 1, 1) <= born <= date.today()


def find_pii(text: str) -> list[PiiMatch]:
    """Every piece of personal data in ``text``, each reported once under its most specific kind."""
    found: list[PiiMatch] = []
    taken: list[tuple[int, int]] = []

    def add(kind: str, m: re.Match) -> None:
        if any(m.start() < e and s < m.end() for s, e in taken):
            return
        taken.append(m.span())
        found.append(PiiMatch(kind, m.group(0)))

    for m in _EMAIL.finditer(text):
        add("email", m)
    for m in _CN_ID.finditer(text):
        if cn_id_valid(m.group(0)):
            add("cn_id", m)
    for m in _CARD.finditer(text):
        digits = re.sub(r"\D", "", m.group(0))
        if luhn_valid(digits) and len(set(digits)) > 1:  # 0000 0000 0000 0000 passes Luhn
            add("credit_card", m)
    for m in _US_SSN.finditer(text):
        add("us_ssn", m)
    for m in _UK_NINO.finditer(text):
        add("uk_nino", m)
    for rx in _PHONES:
        for m in rx.finditer(text):
            if 7 <= sum(c.isdigit() for c in m.group(0)) <= 15:
                add("phone", m)
    return found


def leaked_pii(response: str, prompt: str = "") -> list[PiiMatch]:
    """Personal data in ``response`` that ``prompt`` does not already contain."""
    given = {p.key for p in find_pii(prompt)}
    return [p for p in find_pii(response) if p.key not in given]
