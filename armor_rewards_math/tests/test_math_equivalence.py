"""Labelled equivalence cases (cases/equivalence.jsonl): pairs of every kind the math domain must
judge, equivalent and not. The labels are the mathematical truth, written by hand."""

import json
from pathlib import Path

import pytest
from armor_rewards_math.verify import is_equivalent

CASES = [
    json.loads(line)
    for line in (Path(__file__).parent / "cases" / "equivalence.jsonl").read_text(encoding="utf-8").splitlines()
    if line.strip()
]


def test_every_kind_has_both_labels():
    kinds = {c["kind"] for c in CASES}
    for kind in kinds:
        labels = {c["equivalent"] for c in CASES if c["kind"] == kind}
        assert labels == {True, False}, f"{kind} needs equivalent and non-equivalent cases"
    assert len(CASES) >= 150


@pytest.mark.parametrize("case", CASES, ids=[f"{c['kind']}-{i}" for i, c in enumerate(CASES)])
def test_equivalence(case):
    assert is_equivalent(case["gold"], case["answer"]) is case["equivalent"]


def test_numbers_only_mode_never_calls_sympy():
    # gsm8k's mode: numbers and words are compared, anything else is simply not equivalent
    assert is_equivalent("1234", "1,234", symbolic=False)
    assert not is_equivalent("4", r"\sqrt{16}", symbolic=False)
    assert not is_equivalent("72", "48+24", symbolic=False)


def test_unparseable_ground_truth_is_an_error_not_a_silent_zero():
    with pytest.raises(ValueError, match="cannot parse the ground truth"):
        is_equivalent(r"\frac{", r"\sqrt{2}")


@pytest.mark.parametrize(
    "gold, answer, equivalent",
    [
        (r"1 - \frac{1}{\mathrm{e}}", r"1 - e^{-1}", True),  # math-verify alone cannot parse \mathrm{e} inside \frac
        (r"1 - \frac{1}{\mathrm{e}}", r"1 + \frac{1}{\mathrm{e}}", False),
        (r"\mathrm{e}^{2}", r"e^2", True),
        (r"\mathrm{e}", "2.718281828", True),  # Euler's number, not a letter
        (r"\operatorname{e}^{x}", r"e^x", True),
        (r"{\rm e}^{x}", r"e^x", True),
    ],
)
def test_an_upright_e_is_eulers_number(gold, answer, equivalent):
    assert is_equivalent(gold, answer) is equivalent
