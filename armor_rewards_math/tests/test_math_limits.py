"""Answers too costly to check are refused before anything parses them (limits.py), and numbers too
long for int() are compared as digit strings: no row crashes, and none keeps the checker busy."""

import time

import pytest
from armor_rewards_math.domains import gsm8k_reward, math_reward
from armor_rewards_math.limits import MAX_ANSWER_CHARS, MAX_RESPONSE_CHARS, refusal
from armor_rewards_math.numbers import parse_number


def _nested(opening: str, closing: str, depth: int, leaf: str = "1") -> str:
    return opening * depth + leaf + closing * depth


@pytest.mark.parametrize(
    "answer, reason",
    [
        (_nested(r"\frac{1}{", "}", 2000), "longer than"),
        (_nested(r"\frac{1}{", "}", 20), "nested 20 deep"),
        (r"10^{10^{10^{10}}}", "exponent"),
        (r"10^{10^{10}}", "exponent"),
        (r"9^{9^{9}}", "exponent"),
        ("10**10**10", "exponent"),  # sympy's spelling, read by math-verify's expression parser
        ("10^10^10", "exponent"),  # exponentiation associates to the right
        (r"2^{(10^{10})}", "exponent"),
        (r"10^{99999 \cdot 99999}", "exponent"),
        (r"x^{100000}", "exponent"),
        (r"10^{99999}", "more than 100,000 digits"),
        ("1000000!", "factorial"),
        (r"(10^{5})!", "factorial"),
        (r"\binom{99999}{50000}", "binomial"),
        ("(" * 4 + "x" + ")" * 4, "bare brackets nested 4"),
        ("{{{1}}}", "bare brackets"),
        ("(" + "+".join(["a", r"\frac{x}{y}", r"\sqrt{3}"] * 6) + ")", "inside parentheses"),
        ("+".join(f"x_{{{i}}}" for i in range(17)), "subscripts"),
        (r" \cup ".join(f"[{i},{i}.5)" for i in range(6)), "unions"),
        ("x+" * 200 + "1", "longer than"),
    ],
)
def test_costly_answers_are_refused_with_a_reason(answer, reason):
    assert reason in (refusal(answer) or "")


@pytest.mark.parametrize(
    "answer",
    [
        r"\frac{\sqrt{3}}{2}",
        r"\left(\frac{1}{2}, \frac{\sqrt{3}}{2}\right)",
        r"2^{2016}",
        r"2^{2^{5}}",
        r"e^{-\frac{x^{2}}{2}}",
        r"\sqrt{2+\sqrt{2+\sqrt{2}}}",
        r"(-\infty, -2) \cup (-2, 3) \cup (3, \infty)",
        r"\begin{pmatrix} 1 & 0 \\ 0 & 1 \end{pmatrix}",
        r"(x+1)(x^{2}-x+1)",
        r"30^\circ",
        "1000!",
        r"\binom{10}{5}",
        r"\{1, 2, 3\}",
        r"\$1,234.50",
        "7" * 5000,
        "$" + "7" * 5000 + " dollars",
        _nested(r"\frac{1}{", "}", 10),
    ],
)
def test_ordinary_answers_are_not_refused(answer):
    assert refusal(answer) is None


@pytest.mark.parametrize(
    "response, gold",
    [
        ("\\boxed{" + _nested(r"\frac{1}{", "}", 2000) + "}", "1"),  # 32 s in math-verify without the limit
        (r"\boxed{10^{10^{10^{10}}}}", "1"),  # never finishes without the limit
        (r"The answer is $10^{10^{10}}$.", "1"),
        ("\\boxed{" + "x+" * 5000 + "1}", "1"),
        ("\\boxed{1}, " * 1000, "1"),
        ("Let us think. " * (MAX_RESPONSE_CHARS // 14 + 1) + r"\boxed{1}", "1"),
    ],
)
def test_refused_rows_score_wrong_quickly(response, gold):
    start = time.perf_counter()
    result = math_reward("q", response, gold, {})
    assert time.perf_counter() - start < 1.0
    assert result.score == 0.0 and result.sub_scores["refused"] == 1.0


def test_a_refused_row_counts_in_the_sub_scores_every_row_reports():
    ok = math_reward("q", r"\boxed{2}", "2", {})
    refused = math_reward("q", r"\boxed{10^{10^{10}}}", "2", {})
    assert ok.sub_scores["refused"] == 0.0 and refused.sub_scores["refused"] == 1.0
    assert set(ok.sub_scores) == set(refused.sub_scores)  # the metric's mean is over every row


BIG = "7" * 5000  # past CPython's 4,300-digit int() limit


@pytest.mark.parametrize(
    "response, gold, score",
    [
        (f"\\boxed{{{BIG}}}", BIG, 1.0),
        (f"\\boxed{{{BIG}}}", BIG[:-1] + "8", 0.0),
        (f"\\boxed{{{BIG}}}", "7", 0.0),
        (r"\boxed{7}", BIG, 0.0),
        (r"\boxed{x+1}", BIG, 0.0),
        (f"\\boxed{{0{BIG}.000}}", BIG, 1.0),  # the same digits, written differently
        (f"\\boxed{{{BIG}}} or \\boxed{{{BIG[:-1]}8}}", BIG, 0.0),
        (f"The total is {BIG}", BIG, 0.0),  # no anchored answer
    ],
)
def test_numbers_past_the_int_limit_score_normally(response, gold, score):
    assert math_reward("q", response, gold, {}).score == score


def test_numbers_past_the_int_limit_in_gsm8k():
    assert gsm8k_reward("q", f"#### {BIG}", f"... #### {BIG}", {}).score == 1.0
    assert gsm8k_reward("q", f"So {BIG} in all.", BIG, {}).score == 1.0  # the last-number fallback
    assert gsm8k_reward("q", f"#### {BIG}", BIG + "0", {}).score == 0.0


def test_parse_number_keeps_long_numbers_as_digit_strings():
    n = parse_number("-" + "0" * 10 + BIG + ".500")
    assert n is not None and n.value is None and n.digits == "-" + BIG + ".5"
    assert parse_number("0" * 5000 + "12").value == 12  # short once its leading zeros are gone
    assert parse_number(BIG + "/3").digits == BIG + "/3"


def test_a_long_decorated_number_is_not_refused_but_long_text_is():
    assert refusal("$" + BIG) is None
    assert refusal("x" * (MAX_ANSWER_CHARS + 1)) is not None


@pytest.mark.parametrize("answer", ["1,000.99m²", "5 m²", "3³", "x^²"])
def test_digits_that_are_not_decimal_digits_do_not_crash_the_limits(answer):
    # "²" passes str.isdigit() but not the regex \d: the bound on powers must not assume they agree
    assert refusal(answer) is None
    assert math_reward("q", f"\\boxed{{{answer}}}", "1000.99", {}).sub_scores["refused"] == 0.0


def test_a_unit_with_a_superscript_still_scores():
    assert math_reward("q", r"\boxed{1,000.99m²}", "1000.99", {}).score == 1.0
