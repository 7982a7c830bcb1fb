"""Answer extraction (cases/extraction.jsonl) and the exact number parser."""

import json
from fractions import Fraction
from pathlib import Path

import pytest
from armor_rewards_math.extract import extract_answer, find_boxed, split_alternatives, split_top_level
from armor_rewards_math.numbers import Num, numbers_equal, parse_number, read_decimal_commas

CASES = [
    json.loads(line)
    for line in (Path(__file__).parent / "cases" / "extraction.jsonl").read_text(encoding="utf-8").splitlines()
    if line.strip()
]


@pytest.mark.parametrize("case", CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_extraction(case):
    ext = extract_answer(case["response"], case["sources"], lenient=case.get("lenient", False))
    assert list(ext.values) == case["values"]
    assert ext.source == case["source"]


def test_unknown_source_names_the_known_ones():
    with pytest.raises(ValueError, match="boxed, hash, answer, last_number"):
        extract_answer("x", ["boxd"])


def test_find_boxed_spans_and_escaped_braces():
    text = r"a \boxed{\{1\}} b \boxed{x^{2}}"
    assert [c for _, _, c in find_boxed(text)] == [r"\{1\}", "x^{2}"]
    assert find_boxed(r"\boxed{1") == []


@pytest.mark.parametrize(
    "answer, parts",
    [
        ("1 or 2", ["1", "2"]),
        (r"1 \text{ or } 2", ["1", "2"]),
        ("3或4", ["3", "4"]),
        ("x < 1 or x > 3", ["x < 1 or x > 3"]),  # a union of inequalities is one answer
        ("5", ["5"]),
    ],
)
def test_split_alternatives(answer, parts):
    assert split_alternatives(answer) == parts


@pytest.mark.parametrize(
    "s, items",
    [
        ("1, 2", ["1", "2"]),
        ("1, (2,3)", ["1", "(2,3)"]),
        (r"\{1,2\}", [r"\{1,2\}"]),
        ("x=1 and x=2", ["x=1", "x=2"]),
    ],
)
def test_split_top_level(s, items):
    assert split_top_level(s) == items


@pytest.mark.parametrize(
    "text, value, exact, percent",
    [
        ("1,234", Fraction(1234), True, False),
        ("$1,234.50", Fraction(2469, 2), False, False),
        (r"1\,000", Fraction(1000), True, False),
        ("-3", Fraction(-3), True, False),
        (".5", Fraction(1, 2), False, False),
        ("3/4", Fraction(3, 4), True, False),
        (r"-\frac{1}{2}", Fraction(-1, 2), True, False),
        (r"\dfrac34", Fraction(3, 4), True, False),
        (r"50\%", Fraction(50), True, True),
        ("12 km/h", Fraction(12), True, False),
        (r"30^\circ", Fraction(30), True, False),
        ("5元", Fraction(5), True, False),
        ("5cm", Fraction(5), True, False),
        ("€5", Fraction(5), True, False),
    ],
)
def test_parse_number(text, value, exact, percent):
    assert parse_number(text) == Num(value, exact, percent)


@pytest.mark.parametrize("text", ["5x", "3 or 4", "1,23", "2 i", "x", r"\sqrt{2}", "1/0", ""])
def test_not_a_plain_number(text):
    assert parse_number(text) is None


def test_numbers_equal_tolerance_only_for_decimals():
    third = Num(Fraction(1, 3))
    assert numbers_equal(third, Num(Fraction("0.333333"), exact=False))
    assert not numbers_equal(third, Num(Fraction("0.3333"), exact=False))
    assert not numbers_equal(Num(Fraction(1000000)), Num(Fraction(1000001)))  # exact: no tolerance at all


@pytest.mark.parametrize(
    "text, auto, comma",
    [
        ("1,22", "1.22", "1.22"),
        ("2,74 $", "2.74 $", "2.74 $"),
        ("-0,5", "-0.5", "-0.5"),
        ("1,2345", "1.2345", "1.2345"),
        ("1{,}5", "1.5", "1.5"),
        ("1,234", "1,234", "1.234"),  # auto: exactly three digits after the comma separate thousands
        ("1{,}000", "1{,}000", "1.000"),
        ("1.234,5", "1234.5", "1234.5"),  # points group thousands, the comma is last
        ("1.234.567", "1.234.567", "1234567"),
        ("1,234.5", "1,234.5", "1,234.5"),  # the point is last: commas group thousands
        ("1,2,3", "1,2,3", "1,2,3"),  # a list
        ("(1,5)", "(1,5)", "(1.5)"),  # auto rewrites only a text that is then one plain number
        (r"\frac{1,5}{2}", r"\frac{1,5}{2}", r"\frac{1.5}{2}"),
        ("1, 5", "1, 5", "1, 5"),
    ],
)
def test_read_decimal_commas(text, auto, comma):
    assert read_decimal_commas(text, "auto") == auto
    assert read_decimal_commas(text, "comma") == comma
    assert read_decimal_commas(text, "point") == text


def test_read_decimal_commas_names_the_modes():
    with pytest.raises(ValueError, match="auto, point, comma"):
        read_decimal_commas("1,5", "european")


@pytest.mark.parametrize("text, value", [("2.74 $", Fraction(137, 50)), ("5 €", Fraction(5)), (r"12\$", Fraction(12))])
def test_parse_number_with_the_currency_after(text, value):
    assert parse_number(text).value == value


@pytest.mark.parametrize(
    "text, auto", [("0,111", "0.111"), ("-0,125", "-0.125"), ("0,111,222", "0,111,222"), ("10,111", "10,111")]
)
def test_a_comma_after_a_leading_zero_is_a_decimal_comma(text, auto):
    # no thousands group starts with 0, so 0,111 can only be 0.111; 10,111 stays ten thousand ...
    assert read_decimal_commas(text, "auto") == auto


@pytest.mark.parametrize(
    "text, value",
    [
        ("1 000", 1000),
        ("1 000 000", 1000000),
        ("12 345.5", Fraction(24691, 2)),
        ("1\u00a0000", 1000),
        ("1\u202f000 €", 1000),
        ("10 100 cm", 10100),
    ],
)
def test_space_grouped_thousands_are_one_number(text, value):
    assert parse_number(text).value == value


@pytest.mark.parametrize("text", ["1 2", "1 0000", "12 34"])
def test_spaces_between_numbers_that_are_not_thousands_groups(text):
    assert parse_number(text) is None


@pytest.mark.parametrize(
    "response, values",
    [
        ("1 000", ["1 000"]),  # not 000
        ("I count 1 000 apples", ["1 000"]),
        (r"\frac{10}{9}", [r"\frac{10}{9}"]),  # not 9
        (r"-\frac{10}{9}", [r"-\frac{10}{9}"]),
        (r"so x is \dfrac{3}{4} now", [r"\dfrac{3}{4}"]),
    ],
)
def test_lenient_reads_grouped_thousands_and_latex_fractions_whole(response, values):
    assert list(extract_answer(response, ("boxed", "answer"), lenient=True).values) == values


@pytest.mark.parametrize(
    "response, values",
    [
        ("Final Answer: Jane started growing Sphere 3 hours ago. I hope it is correct.", ["3 hours ago"]),
        ("Final Answer: The temperature dropped to -5 degrees.", ["-5 degrees"]),
        ("Final Answer: The largest $n$ is 34.", ["34"]),  # a verb still comes first
        ("Final answer: Between 3 and 4.", ["Between 3 and 4"]),  # two numbers: the clause is left whole
        ("Final answer: Figure 3 shows x^2", ["Figure 3 shows x^2"]),  # other math beside the number
    ],
)
def test_a_clause_stating_one_number_gives_that_number(response, values):
    assert list(extract_answer(response).values) == values


@pytest.mark.parametrize("response, value", [('The final answer is "42".', "42"), ("Final answer: “7”", "7")])
def test_quotes_around_an_answer_are_removed(response, value):
    assert extract_answer(response).values == (value,)
