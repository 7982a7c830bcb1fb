"""benchmarks/faults.py: its cases still run and judge what they see, and the Reliability table
(docs/reliability.md) has a row for each. Only cases that start no worker run here; the training ones are the
script's (minutes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_loader import load_benchmark

faults = load_benchmark("faults")
RELIABILITY = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
CHEAP = [
    "config: rollout.temperature=nan",
    "model: truncated model.safetensors",
    "disk full",
    "silent listener",
    "score out of range",
]


def test_cases_are_named_once_and_the_reliability_table_has_a_row_for_each():
    names = [c.name for c in faults.CASES]
    assert len(names) == len(set(names))
    page = RELIABILITY.read_text(encoding="utf-8")
    missing = [c.fault for c in faults.CASES if f"| {c.fault} |" not in page]
    assert not missing, (
        f"docs/reliability.md's table lacks rows for {missing}; run python benchmarks/faults.py and paste its table"
    )


@pytest.mark.parametrize("name", CHEAP)
def test_a_cheap_case_runs_and_passes(tmp_path, name):
    case = next(c for c in faults.CASES if c.name == name)
    assert not case.trains
    outcome = case.run(faults.Lab(tmp_path))
    assert outcome.ok, outcome.happened
    assert str(tmp_path) not in outcome.happened  # scratch paths are shown relative


def test_a_case_that_sees_something_else_does_not_pass(tmp_path):
    wrong = faults.cli(lambda lab: ["rollout.temperature=nan", f"trainer.run_dir={lab.root / 'r'}"], 2, r"actor.lr")
    outcome = wrong(faults.Lab(tmp_path))
    assert not outcome.ok and outcome.happened.startswith("exit 2: error: rollout.temperature=nan")
    row = faults.table([(faults.CASES[0], outcome, 1.0)]).splitlines()[-1]
    assert row.endswith("| **no** |") and row.count(" | ") == 3  # four columns: a | inside a message is escaped
