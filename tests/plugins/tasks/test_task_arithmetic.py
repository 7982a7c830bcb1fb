"""The built-in ``arithmetic`` task: row format, determinism, and train/test separation."""

from __future__ import annotations

import re

import pytest

import armor_plugins.tasks.arithmetic as arithmetic_module
from armor_core.testing import registered
from armor_plugins.tasks.arithmetic import generate_arithmetic

_PROBLEM = re.compile(r"^(\d+)([+\-*])(\d+)=$")


def _parse(prompt: str) -> tuple[int, str, int]:
    m = _PROBLEM.match(prompt)
    assert m, f"prompt {prompt!r} is not of the form a<op>b="
    return int(m.group(1)), m.group(2), int(m.group(3))


def _problems(rows: list[dict]) -> set[str]:
    return {r["prompt"] for r in rows}


def test_registered_through_the_hook():
    with registered(arithmetic_module, load_entrypoints=False) as pm:
        task = pm.get("task", "arithmetic")
    assert task.fn is generate_arithmetic
    assert task.fn("train", 3, 0) == generate_arithmetic("train", 3, 0)


def test_rows_are_two_digit_additions_with_the_right_answer():
    rows = generate_arithmetic("train", 300, 0)
    assert len(rows) == 300
    for r in rows:
        assert set(r) == {"prompt", "data_source", "ground_truth"}
        assert r["data_source"] == "arithmetic"
        a, op, b = _parse(r["prompt"])
        assert op == "+" and 10 <= a <= 99 and 10 <= b <= 99
        assert isinstance(r["ground_truth"], str) and r["ground_truth"] == str(a + b)


def test_same_arguments_same_rows_and_the_seed_changes_them():
    assert generate_arithmetic("train", 200, 7) == generate_arithmetic("train", 200, 7)
    assert generate_arithmetic("test", 200, 7) == generate_arithmetic("test", 200, 7)
    assert generate_arithmetic("train", 200, 7) != generate_arithmetic("train", 200, 8)


def test_train_and_test_never_overlap_whatever_the_seeds():
    test = set()
    for seed in (0, 1, 2):
        test |= _problems(generate_arithmetic("test", 3000, seed))
    for seed in (0, 1, 5, 123):
        assert not (_problems(generate_arithmetic("train", 3000, seed)) & test)


def test_splits_partition_all_8100_two_digit_problems_with_enough_test_problems():
    # asking for more rows than a split has cycles through it, so these cover each split fully
    train = _problems(generate_arithmetic("train", 20000, 0))
    test = _problems(generate_arithmetic("test", 20000, 0))
    assert not train & test
    assert len(train) + len(test) == 90 * 90
    # TEST_FRACTION = 0.2 of 8100 is 1620; a hash split lands within a few standard deviations (~36)
    assert 1450 <= len(test) <= 1800


def test_rows_are_distinct_while_the_split_has_enough():
    rows = generate_arithmetic("test", 500, 3)
    assert len(_problems(rows)) == 500


def test_split_of_a_problem_does_not_depend_on_the_other_operators():
    plus_only = {r["prompt"] for r in generate_arithmetic("test", 20000, 0, ops="+")}
    mixed = {r["prompt"] for r in generate_arithmetic("test", 40000, 0, ops="+-") if "+" in r["prompt"]}
    assert plus_only == mixed


def test_val_is_an_alias_of_test():
    assert generate_arithmetic("val", 50, 2) == generate_arithmetic("test", 50, 2)


@pytest.mark.parametrize("ops", ["-", "*", "+-*"])
def test_other_operators(ops):
    rows = generate_arithmetic("train", 200, 1, ops=ops)
    seen = set()
    for r in rows:
        a, op, b = _parse(r["prompt"])
        seen.add(op)
        expected = {"+": a + b, "-": a - b, "*": a * b}[op]
        assert r["ground_truth"] == str(expected)
    assert seen == set(ops)


def test_subtraction_can_be_negative():
    rows = generate_arithmetic("train", 200, 1, ops="-")
    assert any(r["ground_truth"].startswith("-") for r in rows)


@pytest.mark.parametrize("digits,lo,hi", [(1, 0, 9), (3, 100, 999), (5, 10000, 99999)])
def test_digits(digits, lo, hi):
    rows = generate_arithmetic("train", 100, 0, digits=digits)
    for r in rows:
        a, _, b = _parse(r["prompt"])
        assert lo <= a <= hi and lo <= b <= hi
        assert r["ground_truth"] == str(a + b)


def test_sampled_splits_of_large_operands_are_disjoint_and_distinct():
    # 5 digits: 8.1e9 problems, too many to enumerate; rows are rejection-sampled per split
    train = generate_arithmetic("train", 2000, 0, digits=5)
    test = generate_arithmetic("test", 2000, 0, digits=5)
    assert len(_problems(train)) == 2000 and len(_problems(test)) == 2000
    assert not _problems(train) & _problems(test)


def test_one_digit_split_is_small_and_is_cycled():
    rows = generate_arithmetic("test", 50, 0, digits=1)
    distinct = _problems(rows)
    assert len(rows) == 50 and len(distinct) < 50
    assert not distinct & _problems(generate_arithmetic("train", 500, 0, digits=1))


def test_zero_rows():
    assert generate_arithmetic("train", 0, 0) == []


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"split": "dev"}, "split 'dev'"),
        ({"ops": "/"}, "ops='/'"),
        ({"ops": ""}, "ops=''"),
        ({"digits": 0}, "digits=0"),
        ({"digits": 12}, "digits=12"),
        ({"size": -1}, "size=-1"),
        ({"digit": 3}, "unknown parameter"),
    ],
)
def test_bad_arguments_say_what_is_wrong(kwargs, match):
    args = {"split": "train", "size": 10, "seed": 0, **kwargs}
    with pytest.raises((ValueError, TypeError), match=re.escape(match)):
        generate_arithmetic(**args)
