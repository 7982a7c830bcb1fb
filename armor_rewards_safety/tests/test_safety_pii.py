"""Personal-data detection (cases/pii.jsonl): each detector, its check digit, and the prompt exemption."""

import json
from pathlib import Path

import pytest
from armor_rewards_safety.pii import cn_id_valid, find_pii, leaked_pii, luhn_valid

CASES = [
    json.loads(line)
    for line in (Path(__file__).parent / "cases" / "pii.jsonl").read_text(encoding="utf-8").splitlines()
    if line.strip()
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_leaked_pii(case):
    assert [p.kind for p in leaked_pii(case["response"], case["prompt"])] == case["kinds"]


@pytest.mark.parametrize(
    "number, valid",
    [
        ("4111111111111111", True),  # Visa test number
        ("4111111111111112", False),  # last digit changed
        ("79927398713", True),  # the worked example of the Luhn algorithm
        ("79927398710", False),
        ("5555555555554444", True),
    ],
)
def test_luhn(number, valid):
    assert luhn_valid(number) is valid


@pytest.mark.parametrize(
    "number, valid",
    [
        ("11010519491231002X", True),  # weighted sum 167, 167 % 11 = 2 -> 'X'
        ("11010519491231002x", True),
        ("110105194912310021", False),  # wrong check character
        ("110105194913310026", False),  # month 13
    ],
)
def test_cn_id(number, valid):
    assert cn_id_valid(number) is valid


def test_each_item_is_reported_once():
    # a card number is also a run of digits a phone pattern could see; it is reported once, as a card
    assert [p.kind for p in find_pii("4111 1111 1111 1111")] == ["credit_card"]
