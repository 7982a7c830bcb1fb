"""The built-in ``code_ops`` task through the ``code`` domain: every row's reference program scores 1, near
misses score 0; and ``armor sft --val-reward code`` (held-out pass rate) trains on the reference programs
and counts what the domain passes."""

from __future__ import annotations

import json
import time

from armor_core.train.sft import task_pairs
from armor_core.train.sft_reward import reward_passed
from armor_plugins.tasks.code_ops import generate_code_ops, problems

WHOLE = ["whole_response=true", "timeout_s=1", "total_timeout_s=3"]


def test_the_reference_program_of_every_test_problem_and_of_train_rows_scores_1():
    rows = generate_code_ops("test", len(problems("test")), 0) + generate_code_ops("train", 64, 0)
    assert len({r["prompt"] for r in rows[: len(problems("test"))]}) == len(problems("test"))
    with reward_passed("code", WHOLE) as passed:
        assert passed(rows, [r["response"] for r in rows]) == [True] * len(rows)
        # near misses: the wrong number, the wrong operation, a constant answer, a fenced reply (whole_response)
        row = next(r for r in rows if r["prompt"].startswith("add "))
        first_output = json.loads(row["ground_truth"])["outputs"][0].strip()
        wrong = [
            row["response"].replace("+", "+1"),
            row["response"].replace("+", "-"),
            f"print({first_output})",
            f"```python\n{row['response']}\n```",
        ]
        assert passed([row] * 4, wrong) == [False] * 4


def test_a_hanging_program_fails_its_row_in_bounded_time():
    row = generate_code_ops("test", 1, 0)[0]
    with reward_passed("code", WHOLE) as passed:
        start = time.monotonic()
        assert passed([row, row], ["while True: pass", row["response"]]) == [False, True]
        assert time.monotonic() - start < 8


def test_sft_trains_on_the_reference_program_and_keeps_the_tests_as_ground_truth():
    pairs = task_pairs("code_ops", "train", 5, 0, {})
    rows = generate_code_ops("train", 5, 0)
    assert [p["response"] for p in pairs] == [r["response"] for r in rows]
    assert [p["ground_truth"] for p in pairs] == [r["ground_truth"] for r in rows]
    with reward_passed(None) as passed:
        assert passed is None  # without --val-reward: exact match
