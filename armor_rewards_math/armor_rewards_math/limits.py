"""Refuse answers that would take the checker too long, before anything parses them.

math-verify hands LaTeX to an ANTLR parser and then to sympy. Both can be kept busy for a long
time by a few characters: ``\\frac`` nested 2,000 deep takes tens of seconds to parse, a few
levels of bare brackets take the parser a noticeable fraction of a second each, and
``10^{10^{10}}`` asks sympy for an integer of ten billion digits, which never finishes. The
worker's hard timeout catches these, but a timed-out row costs the whole ``reward.timeout_s``, and
a model that finds such an answer slows every step. So the response, every extracted answer and
the ground truth are checked here first, in time linear in their length:

- ``MAX_RESPONSE_CHARS``: a longer response is refused outright, before extraction reads it.
- ``MAX_ANSWER_CHARS``, ``MAX_VALUES``: a longer answer, or more chained answers, is refused.
  A plain number of any length is exempt: it is compared as a digit string, never parsed.
- ``MAX_DEPTH``: brackets and braces nested deeper are refused (``\\frac`` nested 2,000 deep).
- ``MAX_BRACKET_LOAD``, ``MAX_BRACKET_DEPTH``: the parser must decide what each bare bracket opens
  (``(``, ``[``, or a ``{`` that is no command's argument: a group, a tuple, an interval, a set) by
  reading ahead to its end, so its time grows with the text inside them: the lengths of the
  contents of all bare pairs are summed, and a nested pair counts again inside its parent.
  ``(x+1)(x-1)`` loads 6, ``((x+1))`` 8. A bare ``{`` counts as two levels of depth: nested bare
  braces cost the parser about twice what nested parentheses do.
- ``MAX_SCRIPTS``: each ``^`` and ``_`` costs the parser about as much as a short bracket.
- ``MAX_SET_OPERATIONS``: sympy's comparison of unions grows exponentially with their number.
- ``MAX_EXPONENT``, ``MAX_DIGITS``, ``MAX_BINOMIAL``: a power whose exponent could be 100,000 or
  more, a power or factorial whose value could have more than 100,000 digits, or a binomial
  coefficient of more than 10,000 is refused (sympy evaluates them exactly, then factors them).
  They are judged from an upper bound computed on the text (``10^{10^{10}}``: the exponent has 11
  digits), so a tower that is harmless but large on paper (``2^{2^{17}}``) is refused too.

The limits were set so that the slowest answer that passes takes well under a second to check
(``benchmarks/rewards.py --section adversarial`` measures it); ordinary answers are far inside them.
A refused row scores as wrong and sets the ``refused`` sub-score (``reward/<domain>/refused``).
"""

from __future__ import annotations

import math
import re

from armor_rewards_math.numbers import parse_number

__all__ = [
    "MAX_ANSWER_CHARS",
    "MAX_BINOMIAL",
    "MAX_BRACKET_DEPTH",
    "MAX_BRACKET_LOAD",
    "MAX_DEPTH",
    "MAX_DIGITS",
    "MAX_EXPONENT",
    "MAX_RESPONSE_CHARS",
    "MAX_SCRIPTS",
    "MAX_SET_OPERATIONS",
    "MAX_VALUES",
    "refusal",
]

MAX_RESPONSE_CHARS = 1_000_000
MAX_ANSWER_CHARS = 300
MAX_VALUES = 64
MAX_DEPTH = 10
MAX_SCRIPTS = 16
MAX_BRACKET_DEPTH = 3
MAX_BRACKET_LOAD = 120
MAX_SET_OPERATIONS = 4
MAX_EXPONENT = 10**5
MAX_DIGITS = 10**5
MAX_BINOMIAL = 10**4

_LOG_MAX_EXPONENT = math.log10(MAX_EXPONENT)  # numbers are bounded by log10(n + 1): n = 100000 is refused

_PLAIN_NUMBER = re.compile(r"\s*[+-]?\d[\d,]*(?:\.\d+)?\s*")
_DECORATED_NUMBER = re.compile(r"[^\d{}]{0,12}\d[\d,.]*[^\d{}]{0,24}")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_COMMAND = re.compile(r"\\[A-Za-z]+")
_BINOMIAL = re.compile(r"\\[dt]?binom\s*")
_SET_OPERATION = re.compile(r"\\(?:cup|cap|setminus)(?![A-Za-z])|[∪∩]")


class _TooLarge(Exception):
    pass


def refusal(text: str) -> str | None:
    """Why ``text`` (an answer or a ground truth) is too costly to check, or None if it is not."""
    if _PLAIN_NUMBER.fullmatch(text):
        return None
    if len(text) > MAX_ANSWER_CHARS:  # a long number with a currency or a unit is still compared
        decorated = _DECORATED_NUMBER.fullmatch(text) and parse_number(text) is not None
        return None if decorated else f"answer longer than {MAX_ANSWER_CHARS} characters"
    depth, brackets, load = _nesting(text)
    if depth > MAX_DEPTH:
        return f"brackets nested {depth} deep (limit {MAX_DEPTH})"
    if brackets > MAX_BRACKET_DEPTH:
        return f"bare brackets nested {brackets} deep (a bare brace counts two; limit {MAX_BRACKET_DEPTH})"
    if load > MAX_BRACKET_LOAD:
        return f"{load} characters inside parentheses (limit {MAX_BRACKET_LOAD})"
    if text.count("^") + text.count("_") > MAX_SCRIPTS:
        return f"more than {MAX_SCRIPTS} superscripts and subscripts"
    if len(_SET_OPERATION.findall(text)) > MAX_SET_OPERATIONS:
        return f"more than {MAX_SET_OPERATIONS} unions or intersections"
    try:
        powers = text.replace("**", "^")  # sympy's spelling, which math-verify's expression parser reads
        _Magnitude(powers).bound(0, len(powers))
    except _TooLarge as e:
        return str(e)
    return None


def _nesting(text: str) -> tuple[int, int, int]:
    """The deepest nesting of all brackets; the depth of bare brackets alone (``(``, ``[``, and a
    ``{`` that is no command's argument, like ``{{1}}``, counting two); and the load of the bare
    brackets (the summed lengths of their contents; an unclosed one runs to the end)."""
    stack: list[tuple[int, int]] = []  # (weight, index); weight 0: a command's argument
    deepest = deepest_bare = bare = load = 0
    for i, c in enumerate(text):
        if c in "{([":
            weight = 1 if c != "{" else 2 if _bare_brace(text, i) else 0
            stack.append((weight, i))
            bare += weight
            deepest, deepest_bare = max(deepest, len(stack)), max(deepest_bare, bare)
        elif c in "})]" and stack:
            weight, start = stack.pop()
            bare -= weight
            load += i - start - 1 if weight else 0
    load += sum(len(text) - start - 1 for weight, start in stack if weight)
    return deepest, deepest_bare, load


def _bare_brace(text: str, i: int) -> bool:
    """``{`` at ``i`` opens a group of its own: not ``\\{``, ``\\frac{``, ``^{``, ``_{`` or ``}{``."""
    j = i - 1
    while j >= 0 and text[j] == " ":
        j -= 1
    if j < 0:
        return True
    if text[j] in "\\}]^_":
        return False
    while j >= 0 and text[j].isalpha():
        j -= 1
    return not (j >= 0 and text[j] == "\\" and j < i - 1)


class _Magnitude:
    """Upper bounds on log10 of the numbers a piece of LaTeX can denote.

    Numbers, groups and powers are summed (a bound for sums and products alike: log10 of (a+1)(b+1));
    ``a^{b^{c}}`` is folded from the right, as exponentiation associates; ``n!`` is bounded by n^n.
    Letters count as 0: a symbol is never evaluated to a large number.
    """

    def __init__(self, text: str):
        self.text = text
        self.match = _matching_brackets(text)

    def bound(self, i: int, end: int) -> float:
        total, prev = 0.0, None  # prev: the bound of the atom just read, a base for ^ or !
        while i < end:
            c = self.text[i]
            if c == "^" and prev is not None:
                exponents, i = self._exponents(i, end)
                total += self._power(prev, exponents) - prev
                prev = None
                continue
            if c == "!" and prev is not None:
                total += self._factorial(prev) - prev
                prev, i = None, i + 1
                continue
            atom, j = self._atom(i, end)
            if atom is not None:
                total, prev, i = total + atom, atom, j
                continue
            if c == "^":  # after a symbol: only the exponent's own size matters
                exponents, i = self._exponents(i, end)
                self._power(0.0, exponents)
                continue
            prev = prev if c.isspace() else None
            i = j
        return total

    def _atom(self, i: int, end: int) -> tuple[float | None, int]:
        """A number or a bracketed group at ``i``: (its bound, the index after it); else (None, next index)."""
        c = self.text[i]
        if c.isdecimal():  # what \d matches; isdigit() is also true of "²", which \d does not match
            m = _NUMBER.match(self.text, i, end)
            assert m is not None  # text[i] is a digit, which the pattern matches
            whole = m.group().split(".")[0]
            return (math.log10(int(whole) + 1) if len(whole) < 16 else float(len(whole))), m.end()
        if c in "{([" and i in self.match and self.match[i] < end:
            return self.bound(i + 1, self.match[i]), self.match[i] + 1
        if c == "\\":
            m = _COMMAND.match(self.text, i, end)
            if m is None:
                return None, i + 2
            top = _BINOMIAL.match(self.text, i, end)
            if (
                top
                and top.end() in self.match
                and self.bound(top.end() + 1, self.match[top.end()]) > math.log10(MAX_BINOMIAL + 1)
            ):
                raise _TooLarge(f"a binomial coefficient of more than {MAX_BINOMIAL:,}")
            return None, m.end()
        return None, i + 1

    def _exponents(self, i: int, end: int) -> tuple[list[float], int]:
        """The operands of ``^ a ^ b ...`` starting at the ``^`` at ``i``."""
        out = []
        while i < end and self.text[i] == "^":
            i += 1
            while i < end and self.text[i].isspace():
                i += 1
            if i >= end:
                break
            atom, i = self._atom(i, end)
            out.append(atom or 0.0)
            while i < end and self.text[i].isspace():
                i += 1
        return out, i

    def _power(self, base: float, exponents: list[float]) -> float:
        """log10 bound of base^(e1^(e2^...)), from the logs of the base and exponents."""
        log = 0.0  # log10 of the exponent tower read so far, from the top: x^1 = x
        for e in reversed(exponents):
            if log > _LOG_MAX_EXPONENT:
                raise _TooLarge(f"an exponent may be {MAX_EXPONENT:,} or more")
            log = e * 10**log
        if log > _LOG_MAX_EXPONENT:
            raise _TooLarge(f"an exponent may be {MAX_EXPONENT:,} or more")
        value = base * 10**log
        if value > MAX_DIGITS:
            raise _TooLarge(f"a power may have more than {MAX_DIGITS:,} digits")
        return value

    def _factorial(self, log_n: float) -> float:
        if log_n > 6:
            raise _TooLarge(f"a factorial may have more than {MAX_DIGITS:,} digits")
        value = 10**log_n * log_n  # log10(n!) <= n log10(n)
        if value > MAX_DIGITS:
            raise _TooLarge(f"a factorial may have more than {MAX_DIGITS:,} digits")
        return value


def _matching_brackets(text: str) -> dict[int, int]:
    """Opening index -> closing index for every balanced pair; ``[1, 3)`` pairs across kinds."""
    stack: list[int] = []
    match = {}
    for i, c in enumerate(text):
        if c in "{([":
            stack.append(i)
        elif c in "})]" and stack:
            match[stack.pop()] = i
    return match
