"""Is an extracted answer equivalent to the ground truth?

Cheapest test first: identical after removing spaces; then both plain numbers (exact rational
arithmetic, ``numbers.py``); then both plain words (``\\text{Monday}`` vs ``monday``); and only
then math-verify (Hugging Face's LaTeX -> sympy parser and comparer), which handles fractions,
roots, pi, symbolic expressions, sets, intervals, tuples, matrices and equations like ``x = 3``.

math-verify's own timeout uses ``signal.alarm``, which works only in the main thread, so it is
switched off here; the hard limit is enforced from outside by ARMOR's RewardManager, which runs
this domain in a worker process it kills when ``reward.timeout_s`` is exceeded.

Also here, the anti-hacking checks against the prompt: an answer that only restates it
(``is_restatement``), and an answer copied from it (``is_echo``).
"""

from __future__ import annotations

import logging
import re

from armor_rewards_math.extract import clean_answer, split_top_level
from armor_rewards_math.numbers import numbers_equal, parse_number, strip_latex_noise

__all__ = ["ECHO_CHARS", "is_echo", "is_equivalent", "is_multi_valued", "is_restatement", "squash", "warm_up"]

_SPACES = re.compile(r"\s+")
_WORDS = re.compile(r"^[A-Za-z\u4e00-\u9fff][A-Za-z\u4e00-\u9fff' -]*$")
_CHOICE = re.compile(r"^\(?([A-Ea-e])\)?$")


class _DropTimeoutDisabledWarning(logging.Filter):
    # math-verify warns once that its timeout is off; here that is by design (see module docstring)
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


_mv = None


def _math_verify():
    """Import math-verify (and sympy, ~0.5 s) on first use, not when the plugin is registered."""
    global _mv
    if _mv is None:
        import math_verify

        for name in ("math_verify.parser", "math_verify.grader"):
            logging.getLogger(name).addFilter(_DropTimeoutDisabledWarning())
        _mv = math_verify
    return _mv


def warm_up() -> None:
    """Import math-verify and its LaTeX parser now, so that the first timed check does not pay for it."""
    _parse("1")


def squash(s: str) -> str:
    """A canonical string for textual comparison: no spaces, one spelling of each operator."""
    s = strip_latex_noise(s)
    s = re.sub(r"\\times|\\cdot|×|·|∗", "*", s)
    s = re.sub(r"\\div|÷", "/", s)
    return _SPACES.sub("", s).strip("$")


def _words(s: str) -> str | None:
    """Lower-cased text if ``s`` is plain words (``\\text{Monday}``, ``(B)``), else None."""
    s = strip_latex_noise(s).strip()
    choice = _CHOICE.match(s)
    if choice:
        return choice.group(1).lower()
    return " ".join(s.lower().split()) if _WORDS.match(s) and len(s) > 1 else None


def is_multi_valued(gold: str) -> bool:
    """A list or set of answers (``1, 2``, ``$$1,2,3$$``, ``\\{1, 2\\}``, ``{1, 2}``, ``x \\in \\{1, 2\\}``,
    ``x=1, x=2``), not one number like ``1,000``."""
    g = strip_latex_noise(clean_answer(gold))
    if parse_number(g) is not None:
        return False
    # "{1,2,3}": LaTeX braces only group, but around a whole list they can mean nothing but a set
    braced = g.startswith("{") and g.endswith("}") and len(split_top_level(g[1:-1])) > 1
    return braced or g.startswith("\\{") or ("\\{" in g and "," in g) or len(split_top_level(g)) > 1


# an upright e is Euler's number (ISO 80000-2); math-verify reads \mathrm{e} as text, and inside
# \frac it cannot parse it at all, while it reads a bare e as Euler's number
_UPRIGHT_E = re.compile(r"\\(?:mathrm|operatorname)\s*\{\s*e\s*\}|\{\s*\\rm\s+e\s*\}")


def _parse(s: str):
    s = _UPRIGHT_E.sub("{e}", s)
    mv = _math_verify()
    configs = [mv.LatexExtractionConfig(), mv.ExprExtractionConfig()]
    # None: no signal-based timeout (math_verify accepts it, though its annotation says int)
    return mv.parse(
        f"$\\boxed{{{s}}}$",
        extraction_config=configs,
        parsing_timeout=None,  # pyright: ignore[reportArgumentType]
    )


def is_equivalent(gold: str, answer: str, *, symbolic: bool = True) -> bool:
    """True if ``answer`` means the same as ``gold``.

    :param symbolic: fall back to math-verify when the cheap tests cannot decide; without it, only
        numbers and words are compared (the ``gsm8k`` domain: fast and unable to hang).
    :raises ValueError: the ground truth is something math-verify cannot parse (a data problem).
    """
    gold, answer = str(gold).strip(), str(answer).strip()
    if not answer:
        return False
    if squash(gold) == squash(answer):
        return True
    g_num, a_num = parse_number(gold), parse_number(answer)
    if g_num is not None and a_num is not None:
        return numbers_equal(g_num, a_num)
    if (g_num is not None and g_num.value is None) or (a_num is not None and a_num.value is None):
        return False  # a number too long for int() equals only a number with the same digits
    g_words, a_words = _words(gold), _words(answer)
    if g_words is not None and a_words is not None:
        return g_words == a_words
    if not symbolic:
        return False
    parsed_gold = _parse(gold)
    if not any(not isinstance(x, str) for x in parsed_gold):  # only math-verify's raw-string fallback
        raise ValueError(
            f"math-verify cannot parse the ground truth {gold[:200]!r}; write it as LaTeX or a plain number"
        )
    parsed_answer = _parse(answer)
    if not parsed_answer:
        return False
    # allow_set_relation_comp: "x \\le 2" answers "(-\\infty, 2]" (math-verify only allows it for set answers)
    return bool(_math_verify().verify(parsed_gold, parsed_answer, timeout_seconds=None, allow_set_relation_comp=True))


_PLAIN = re.compile(r"^[+-]?(?:\d+(?:\.\d+)?|\.\d+|[A-Za-z])$")
_OPERATOR = re.compile(r"[+\-*/^!]|\\(?:frac|sqrt|sum|prod|int|binom|log|ln|sin|cos|tan)")


def is_restatement(answer: str, prompt: str, gold: str) -> bool:
    """The answer is an unevaluated expression copied from the prompt (``\\boxed{12 \\times 34}``).

    A plain number or a single symbol is never a restatement (the prompt may well contain the
    answer's value), and neither is an answer written exactly as the ground truth. A fraction is an
    expression here: ``\\frac{6}{8}`` copied from "Simplify \\frac{6}{8}" does not score.
    """
    a = squash(answer)
    if not a or _PLAIN.match(a):
        return False
    if not _OPERATOR.search(a.lstrip("+-")):
        return False
    return a in squash(prompt) and a != squash(gold)


#: How much text, ending with the answer, must be a verbatim copy of the prompt for ``is_echo``.
ECHO_CHARS = 64


def is_echo(response: str, answer_end: int, prompt: str) -> bool:
    """The answer ending at ``answer_end`` closes a passage copied verbatim from the prompt.

    The ``ECHO_CHARS`` characters of the response that end with the answer (``... so the answer is
    \\boxed{7}``) appear as they are in the prompt: the model is repeating a few-shot example or a
    hint, not answering. A short answer that merely also occurs in the prompt (``\\boxed{42}``, "The
    answer is 42") is not an echo: a correct answer does not become wrong because the prompt
    happens to contain it.
    """
    start = answer_end - ECHO_CHARS
    return start >= 0 and response[start:answer_end] in prompt
