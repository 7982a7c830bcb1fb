"""How often ARMOR's ``math`` reward agrees with a public math-equivalence suite: the regression
tests of Hugging Face's Math-Verify.

Data: every ``(gold, pred, expected)`` row of the parametrized tests in
https://github.com/huggingface/Math-Verify, ``tests/test_all.py``, ``test_numina_cases.py``,
``test_open_thoughts.py``, ``test_yujianll.py`` and ``test_boxed.py`` (267 rows at commit
5d148cfaaf99214c2e4ffb4bc497ab042c592a7a, 2025-07-02). The repository is Apache-2.0 licensed
(``LICENCE``); ``test_all.py`` carries an MIT header (Copyright 2024 The HuggingFace Team). Nothing
is copied into ARMOR: the rows are read at run time from a local copy, a checkout or a bare git
directory, by parsing the test files with ``ast`` (they are never imported or run), and nothing is
downloaded. A few rows carry an option of Math-Verify's own (``precision``,
``allow_set_relation_comp``); ARMOR has no such option, and the option is shown with the row.

Each row is scored three ways:

- ``boxed``: the full reward (extraction, anti-hacking rules, equivalence) on the prediction with
  its answer given as ARMOR expects, in ``\\boxed{}``: a prediction that boxes its answer is the
  response as it is, any other is wrapped whole (``\\boxed{<pred>}``). The gold is the ground truth.
- ``equivalence``: ``is_equivalent`` alone, extraction taken out of the picture: both sides are
  first reduced to their answers by Math-Verify's own extraction, configured as the suite's test
  configures it (its ``match_types``), and those answers are compared.
- ``lenient``: the full reward with ``extraction: lenient`` on the raw prediction (no box added).

A row agrees when the reward's ``correct`` sub-score equals ``expected``; an exception never agrees.

    python benchmarks/math_equivalence.py                      # about a minute on 2 cores
    python benchmarks/math_equivalence.py --errors             # and list every disagreement
    python benchmarks/math_equivalence.py --suite ~/src/Math-Verify --rev main
"""

from __future__ import annotations

import argparse
import ast
import math
import os
import re
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

SUITE_FILES = (
    "tests/test_all.py",
    "tests/test_numina_cases.py",
    "tests/test_open_thoughts.py",
    "tests/test_yujianll.py",
    "tests/test_boxed.py",
)
_ROOT = Path(__file__).resolve().parents[1]
_DEFAULT_SUITES = [
    Path(p)
    for p in (
        os.environ.get("MATH_VERIFY_REPO", ""),
        _ROOT.parent / "Math-Verify",
        "/work/.mirror/huggingface+Math-Verify/repo",
    )
    if str(p)
]
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
MODES = ("boxed", "equivalence", "lenient")
REFERENCE = "math-verify"  # the suite's own library, installed version: a baseline, not an ARMOR mode


@dataclass(frozen=True)
class Row:
    where: str  # file::test[index]
    gold: str
    pred: str
    expected: int
    match_types: tuple[str, ...] | None  # the suite's extraction for this test; None: Math-Verify's defaults
    options: dict[str, Any] = field(default_factory=dict)  # the test's other columns (precision, ...)


# ---------------------------------------------------------------- reading the suite


def _git_dir(suite: Path) -> Path | None:
    if (suite / ".git").exists():
        return suite / ".git"
    return suite if (suite / "HEAD").is_file() and (suite / "objects").is_dir() else None


def read_suite_file(suite: Path, path: str, rev: str) -> str:
    """One file of the suite: from a bare git directory at ``rev``, else from the working tree."""
    git = _git_dir(suite)
    if git is not None and not (suite / path).is_file():
        return subprocess.run(
            ["git", "--git-dir", str(git), "show", f"{rev}:{path}"], check=True, capture_output=True, text=True
        ).stdout
    return (suite / path).read_text(encoding="utf-8")


def suite_commit(suite: Path, rev: str) -> str:
    git = _git_dir(suite)
    if git is None:
        return "(not a git copy)"
    out = subprocess.run(["git", "--git-dir", str(git), "rev-parse", rev], capture_output=True, text=True)
    return out.stdout.strip() or f"({rev}: unknown revision)"


def _value(node: ast.expr) -> Any:
    """A literal, or an f-string over calls of ``math`` functions on literals (``f"{math.sqrt(17):.15f}"``)."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_value(e) for e in node.elts)
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.FormattedValue):
                spec = "".join(str(_value(v)) for v in part.format_spec.values) if part.format_spec else ""
                out.append(format(_value(part.value), spec))
            else:
                out.append(str(_value(part)))
        return "".join(out)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "math"
        and callable(getattr(math, node.func.attr, None))
    ):
        return getattr(math, node.func.attr)(*(ast.literal_eval(a) for a in node.args))
    raise ValueError(f"line {node.lineno}: not a literal: {ast.unparse(node)[:80]}")


def _match_types(test: ast.FunctionDef) -> tuple[str, ...] | None:
    """The ``match_types`` the test passes to the suite's ``compare_strings`` (its default: latex, expr)."""
    for node in ast.walk(test):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "compare_strings":
            for kw in node.keywords:
                if kw.arg == "match_types":
                    return tuple(ast.literal_eval(kw.value))
            return ("latex", "expr")
    return None


def rows_from(source: str, name: str) -> list[Row]:
    """The rows of every ``@pytest.mark.parametrize`` with ``gold``, ``pred`` and ``expected`` (or ``result``)."""
    rows = []
    for test in ast.walk(ast.parse(source)):
        if not isinstance(test, ast.FunctionDef):
            continue
        for deco in test.decorator_list:
            if not (isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "parametrize"):
                continue
            names = [n.strip() for n in ast.literal_eval(deco.args[0]).split(",")]
            label = "expected" if "expected" in names else "result"
            if not {"gold", "pred", label} <= set(names):
                continue
            for i, element in enumerate(deco.args[1].elts):
                values = dict(zip(names, _value(element)))
                options = {k: v for k, v in values.items() if k not in ("gold", "pred", label)}
                rows.append(
                    Row(
                        f"{name}::{test.name}[{i}]",
                        values["gold"],
                        values["pred"],
                        int(values[label]),
                        _match_types(test),
                        options,
                    )
                )
    return rows


def load_suite(suite: Path, rev: str) -> list[Row]:
    return [row for path in SUITE_FILES for row in rows_from(read_suite_file(suite, path, rev), Path(path).name)]


# ---------------------------------------------------------------- scoring


def _reference_parse(text: str, match_types: tuple[str, ...] | None) -> list:
    """Math-Verify's own extraction of ``text``, configured as the suite's test configures it."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    if match_types is None:
        return parse(text)
    kinds = {"latex": lambda: LatexExtractionConfig(boxed_match_priority=0), "expr": ExprExtractionConfig}
    return parse(text, [kinds[t]() for t in match_types])


def scorers() -> dict[str, Callable[[Row], int]]:
    from armor_rewards_math.domains import math_reward
    from armor_rewards_math.extract import clean_answer
    from armor_rewards_math.verify import is_equivalent
    from math_verify import verify

    def reference(row: Row) -> int:  # the suite's own verdict, with the installed math-verify
        gold, pred = (_reference_parse(t, row.match_types) for t in (row.gold, row.pred))
        return int(
            verify(
                gold,
                pred,
                float_rounding=row.options.get("precision", 6),
                allow_set_relation_comp=row.options.get("allow_set_relation_comp", False),
            )
        )

    def answer(text: str, match_types: tuple[str, ...] | None) -> str:
        parsed = _reference_parse(text, match_types)
        return str(parsed[1]) if len(parsed) > 1 else clean_answer(text)  # nothing found: only unwrap

    def boxed(row: Row) -> int:
        response = row.pred if _BOX.search(row.pred) else f"\\boxed{{{row.pred}}}"
        return int(math_reward("", response, row.gold, {}).sub_scores["correct"])

    def equivalence(row: Row) -> int:
        return int(is_equivalent(answer(row.gold, row.match_types), answer(row.pred, row.match_types)))

    def lenient(row: Row) -> int:
        return int(math_reward("", row.pred, row.gold, {}, extraction="lenient").sub_scores["correct"])

    return {"boxed": boxed, "equivalence": equivalence, "lenient": lenient, REFERENCE: reference}


def score(rows: list[Row]) -> tuple[dict[str, list[int | str]], dict[str, float]]:
    """Per mode: each row's ``correct`` (or the exception, as text), and the seconds the mode took."""
    results: dict[str, list[int | str]] = {}
    seconds = {}
    for mode, fn in scorers().items():
        start, out = time.perf_counter(), []
        for row in rows:
            try:
                out.append(fn(row))
            except Exception as e:  # a crash is a finding, not the end of the run
                out.append(f"{type(e).__name__}: {e}"[:120])
        results[mode], seconds[mode] = out, time.perf_counter() - start
    return results, seconds


# ---------------------------------------------------------------- report


def report(rows: list[Row], results: dict[str, list[int | str]], seconds: dict[str, float], errors: bool) -> None:
    from importlib.metadata import version

    n, modes = len(rows), (*MODES, REFERENCE)
    labels = {REFERENCE: f"{REFERENCE} {version('math-verify')} (reference)"}
    print("| mode | agrees with `expected` | disagrees | exceptions | seconds |")
    print("|---|---|---|---|---|")
    for mode in modes:
        got = results[mode]
        agree = sum(g == r.expected for g, r in zip(got, rows))
        crashed = sum(isinstance(g, str) for g in got)
        print(f"| {labels.get(mode, mode)} | {agree} / {n} | {n - agree - crashed} | {crashed} | {seconds[mode]:.1f} |")
    per_file: dict[str, list[int]] = defaultdict(lambda: [0] * (len(modes) + 1))
    for i, row in enumerate(rows):
        counts = per_file[row.where.split("::")[0]]
        counts[0] += 1
        for j, mode in enumerate(modes, 1):
            counts[j] += results[mode][i] == row.expected
    print("\n| file | rows | " + " | ".join(modes) + " |")
    print("|---|---|" + "---|" * len(modes))
    for name, (total, *agree) in per_file.items():
        print(f"| {name} | {total} | " + " | ".join(str(a) for a in agree) + " |")
    if not errors:
        return
    for mode in modes:
        print(f"\n## {labels.get(mode, mode)}: disagreements")
        for row, got in zip(rows, results[mode]):
            if got != row.expected:
                options = f" {row.options}" if row.options else ""
                print(
                    f"- {row.where}{options} expected {row.expected}, got {got}\n"
                    f"    gold {row.gold[-100:]!r}\n    pred {row.pred[-100:]!r}"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--suite",
        type=Path,
        default=next((p for p in _DEFAULT_SUITES if p.exists()), None),
        help="a checkout or bare git directory of huggingface/Math-Verify "
        "(default: $MATH_VERIFY_REPO, ../Math-Verify, or the local mirror)",
    )
    parser.add_argument("--rev", default="HEAD", help="the revision to read from a git copy")
    parser.add_argument("--errors", action="store_true", help="list every disagreement, per mode")
    args = parser.parse_args()
    if args.suite is None or not args.suite.exists():
        parser.error(
            f"no copy of Math-Verify at {args.suite or ' or '.join(map(str, _DEFAULT_SUITES))}; "
            "git clone https://github.com/huggingface/Math-Verify and pass --suite PATH"
        )
    rows = load_suite(args.suite, args.rev)
    print(f"Math-Verify tests at {suite_commit(args.suite, args.rev)}: {len(rows)} (gold, pred, expected) rows\n")
    results, seconds = score(rows)
    report(rows, results, seconds, args.errors)


if __name__ == "__main__":
    main()
