"""benchmarks/collapse.py: the bar each row is held to, judged from saved results (no run starts here)."""

from __future__ import annotations

from bench_loader import load_benchmark

collapse = load_benchmark("collapse")


def _runs(accs, actions=None, finite=True):
    return [
        {"seed": s, "acc": a, "finite": finite, "actions": (actions or {}) if s == 1 else {}}
        for s, a in enumerate(accs, start=1)
    ]


def test_a_row_where_an_unguarded_seed_collapses_needs_nine_in_ten_near_the_clean_mean():
    off = _runs([0.7, 0.01, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7])
    assert collapse.verdict("lr_x10", off, _runs([0.70] * 9 + [0.3]), ref=0.72) == "collapse: 9/10: met"
    assert collapse.verdict("lr_x10", off, _runs([0.70] * 8 + [0.3] * 2), ref=0.72) == "collapse: 8/10: NOT met"
    # with the clean recipe's own unguarded seeds, it says how many of those clear the same line
    clean = _runs([0.72] * 7 + [0.6] * 3)
    assert collapse.verdict("lr_x10", off, _runs([0.70] * 8 + [0.3] * 2), ref=0.72, clean=clean) == (
        "collapse (clean seeds: 7/10): 8/10: NOT met"
    )


def test_a_slow_row_is_judged_seed_by_seed_against_its_unguarded_run():
    off = _runs([0.45, 0.50])  # learns slowly, never collapses: the bar is no harm
    assert collapse.verdict("stale", off, _runs([0.41, 0.46]), ref=0.74) == "no harm: 2/2: met"
    assert collapse.verdict("stale", off, _runs([0.39, 0.50]), ref=0.74) == "no harm: 1/2: NOT met"
    dead = [{"seed": 2, "acc": None, "finite": False, "actions": {}}]
    assert collapse.verdict("stale", off, _runs([0.45]) + dead, ref=0.74).endswith("NOT met")


def test_a_clean_row_allows_one_point_and_one_seed_in_ten_acted_on():
    off = _runs([0.74] * 10)
    assert (
        collapse.verdict("clean", off, _runs([0.74] * 10, {"x:skip": 1}), ref=0.74) == "clean: +0.0 pts, 1 acted: met"
    )
    two = _runs([0.74] * 10, {"x:skip": 1})
    two[1]["actions"] = {"x:skip": 1}
    assert collapse.verdict("clean", off, two, ref=0.74).endswith("NOT met")
    assert collapse.verdict("clean", off, _runs([0.72] * 10), ref=0.74).startswith("clean: -2.0 pts")
    # fewer seeds with the guard than without: compared on the seeds run both ways, not on the others' spread
    off = _runs([1.0, 0.99, 0.98, 1.0, 0.96, 0.87, 0.88])
    assert collapse.verdict("clean", off, _runs([1.0, 0.99, 0.98]), ref=0.954) == (
        "clean: +0.0 pts on the 3 seeds run both ways, 0 acted: met"
    )
