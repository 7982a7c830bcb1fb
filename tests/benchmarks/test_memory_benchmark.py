"""benchmarks/memory.py measures what it says: the plain path's peak grows with the logits, the
chunked path's does not, and the targets are judged from the numbers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from bench_loader import BENCHMARKS, load_benchmark

memory = load_benchmark("memory")


@pytest.mark.slow
def test_the_chunked_passes_hold_a_fraction_of_the_plain_paths_memory():
    rows, length, vocab = 2, 64, memory.VOCAB
    out = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "memory.py"),
            "--lengths",
            str(length),
            "--rows",
            str(rows),
            "--chunk",
            "16",
            "--reps",
            "1",
            "--threads",
            "1",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    results = {(r["pass"], bool(r["chunk"])): r for r in json.loads(out.stdout)}
    assert set(results) == {("update", False), ("update", True), ("reference", False), ("reference", True)}
    logits_gb = rows * length * vocab * 4 / 1e9
    plain, chunked = results["update", False], results["update", True]
    assert plain["peak_above_gb"] >= 2.5 * logits_gb  # the full logits, their softmax and their gradient
    assert chunked["peak_above_gb"] < plain["peak_above_gb"] / 2
    assert results["reference", True]["peak_above_gb"] < results["reference", False]["peak_above_gb"]
    assert all(r["s_per_ktok"] > 0 and r["baseline_gb"] > 0 for r in results.values())


def _result(pass_, chunk, length, peak, s):
    return {
        "pass": pass_,
        "chunk": chunk,
        "rows": 4,
        "length": length,
        "peak_above_gb": peak,
        "s_per_ktok": s,
        "baseline_gb": 0.5,
    }


def test_targets_are_judged_from_the_largest_chunked_update_and_each_pair():
    ok = [
        _result("update", 0, 512, 6.0, 1.0),
        _result("update", 1024, 512, 0.5, 1.2),
        _result("update", 1024, 8192, 2.9, 1.3),
    ]
    verdicts = memory.check_targets(ok)
    assert [v.split(":")[0] for v in verdicts] == ["met", "met"]
    assert "4 x 8192" in verdicts[0] and "1.20x" in verdicts[1]
    bad = [
        _result("update", 0, 512, 6.0, 1.0),
        _result("update", 1024, 512, 0.5, 1.4),
        _result("update", 1024, 8192, 3.1, 1.3),
    ]
    assert [v.split(":")[0] for v in memory.check_targets(bad)] == ["MISSED", "MISSED"]
    skipped = {"pass": "update", "chunk": 0, "rows": 4, "length": 8192, "skipped": True, "error": "not run"}
    assert len(memory.check_targets([skipped, _result("update", 1024, 8192, 1.0, 1.0)])) == 1


def test_plain_runs_only_where_its_logits_fit():
    assert memory.plain_estimate_gb("update", 4, 512, memory.VOCAB) == pytest.approx(6.22, abs=0.01)
    assert memory.plain_estimate_gb("reference", 4, 8192, memory.VOCAB) == pytest.approx(39.8, abs=0.1)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rows", "0"], "--rows must be at least 1, got 0"),
        (["--chunk", "0"], "--chunk and --sweep take positive token counts"),
        (["--lengths", "-1"], "--lengths, --chunk and --sweep take positive token counts"),
        (["--passes", "backward"], "argument --passes: invalid choice: 'backward'"),
    ],
)
def test_bad_arguments_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        memory.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
