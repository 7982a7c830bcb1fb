"""The built-in ``code_ops`` task: row format, the reference program's outputs, determinism, train/test
separation, bad parameters. (That every reference passes the ``code`` domain is in armor-rewards-code's
tests: this distribution does not import the pack.)"""

from __future__ import annotations

import json
import re

import pytest

import armor_plugins.tasks.code_ops as code_ops_module
from armor_core.testing import registered
from armor_plugins.tasks.code_ops import OPERATIONS, generate_code_ops, problems

_PROMPT = re.compile(r"^([a-z]+) (\d+):$")


def test_registered_through_the_hook():
    with registered(code_ops_module, load_entrypoints=False) as pm:
        task = pm.get("task", "code_ops")
    assert task.fn is generate_code_ops


def test_rows_hold_tests_the_reference_program_meets():
    rows = generate_code_ops("train", 200, 0)
    assert {r["prompt"].split()[0] for r in rows} == set(OPERATIONS)
    for r in rows:
        assert set(r) == {"prompt", "data_source", "ground_truth", "response"} and r["data_source"] == "code"
        name, n = _PROMPT.match(r["prompt"]).groups()
        truth = json.loads(r["ground_truth"])
        assert len(truth["inputs"]) == len(truth["outputs"]) == 3
        assert len(set(truth["inputs"])) == 3  # distinct, so a constant program cannot pass
        assert r["response"] == OPERATIONS[name][0].replace("N", n)
        for stdin, stdout in zip(truth["inputs"], truth["outputs"]):
            printed: list[str] = []
            names = {"input": lambda s=stdin: s.rstrip("\n"), "print": lambda v, out=printed: out.append(f"{v}\n")}
            exec(r["response"], names)
            assert printed == [stdout], (r["prompt"], stdin)


def test_a_program_that_ignores_its_input_cannot_meet_every_case():
    for r in generate_code_ops("test", 100, 3):
        outputs = json.loads(r["ground_truth"])["outputs"]
        name = r["prompt"].split()[0]
        if name in ("add", "sub") or (name == "times" and not r["prompt"].endswith(" 0:")):
            assert len(set(outputs)) > 1, r


def test_splits_are_disjoint_across_seeds_and_rows_follow_the_seed():
    test_problems = set(problems("test"))
    assert 50 <= len(test_problems) <= 80 and not test_problems & set(problems("train"))
    train = {r["prompt"] for s in range(4) for r in generate_code_ops("train", 300, s)}
    held_out = {r["prompt"] for s in range(4) for r in generate_code_ops("val", 100, s)}
    assert not train & held_out and len(held_out) == len(test_problems)
    assert generate_code_ops("test", 20, 5) == generate_code_ops("test", 20, 5)
    assert generate_code_ops("test", 20, 5) != generate_code_ops("test", 20, 6)
    assert [len(json.loads(r["ground_truth"])["inputs"]) for r in generate_code_ops("train", 4, 0, cases=5)] == [5] * 4
    assert generate_code_ops("train", 0, 0) == []


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"split": "dev"}, ValueError, "split 'dev'"),
        ({"cases": 1}, ValueError, "cases=1"),
        ({"digits": 2}, TypeError, "unknown parameter"),
        ({"size": -1}, ValueError, "size=-1"),
    ],
)
def test_bad_parameters_are_clear_errors(kwargs, error, match):
    args = {"split": "train", "size": 4, "seed": 0, **kwargs}
    with pytest.raises(error, match=match):
        generate_code_ops(args.pop("split"), args.pop("size"), args.pop("seed"), **args)
