"""Ground truths of the ``code`` domain, the runner table, program extraction and output comparison.

Formats (a dict, or a JSON string of one, as verl and APPS/TACO store them):

- stdin/stdout: ``{"inputs": [str, ...], "outputs": [str, ...]}``;
- function calls: ``{"fn_name": name, "inputs": [[arg, ...], ...], "outputs": [value, ...]}``;
- assertion programs: ``{"test": "def check(candidate): ...", "entry_point": name}`` (HumanEval; one
  case), or ``{"test": ["assert f(1) == 2", ...], "entry_point": name}`` (MBPP; one case per assertion,
  ``"setup"`` optional code run before each).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["RUNNERS", "Plan", "Runner", "extract_program", "plan_of", "same_stdout", "same_value"]


@dataclass(frozen=True)
class Runner:
    """How a language runs: its fence names, and for stdio, ``argv`` (``{file}`` is the program) or None for
    the harness's own Python. Another language is another entry here (stdio tests only)."""

    fences: tuple[str, ...]
    argv: tuple[str, ...] | None = None
    filename: str = "solution.py"


#: language -> runner (``extra["language"]`` of a row, else the domain's ``language`` parameter)
RUNNERS: dict[str, Runner] = {"python": Runner(fences=("python", "python3", "py"))}


@dataclass(frozen=True)
class Plan:
    """One row's tests: the mode, the inputs the sandbox sees, and what stays in the parent (or, for
    assertion programs, goes to the sandbox only after the program's processes were forked)."""

    mode: str  # "stdio" | "call" | "assert"
    inputs: list
    outputs: list
    fn_name: str = ""
    tests: tuple[str, ...] = ()
    setup: str = ""
    check: bool = False


def _where(extra: Mapping[str, Any]) -> str:
    return f"row {extra['index']}" if "index" in extra else "a code row"


def plan_of(ground_truth: Any, extra: Mapping[str, Any]) -> Plan:
    """The tests of a row; ``ValueError`` naming the row and the key for a ground truth that holds none."""
    where = _where(extra)
    gt = ground_truth
    if isinstance(gt, str):
        try:
            gt = json.loads(gt)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: code ground truth is a string but not JSON ({e.msg})") from None
    if not isinstance(gt, Mapping):
        raise ValueError(
            f"{where}: code ground truth must be a mapping (inputs/outputs or test/entry_point), got "
            f"{type(gt).__name__}"
        )
    if "test" in gt:
        entry = gt.get("entry_point") or extra.get("entry_point")
        if not isinstance(entry, str) or not entry.isidentifier():
            raise ValueError(f"{where}: ground_truth['test'] needs 'entry_point', the function's name, got {entry!r}")
        tests = gt["test"]
        if isinstance(tests, str) and tests.strip():
            return Plan("assert", [], [], entry, (tests,), str(gt.get("setup") or ""), check="def check" in tests)
        if isinstance(tests, list) and tests and all(isinstance(t, str) and t.strip() for t in tests):
            return Plan("assert", [], [], entry, tuple(tests), str(gt.get("setup") or ""))
        raise ValueError(f"{where}: ground_truth['test'] must be test code or a non-empty list of assertions")
    if "inputs" not in gt or "outputs" not in gt:
        raise ValueError(
            f"{where}: code ground truth has neither 'inputs'/'outputs' nor 'test'/'entry_point' (keys: {sorted(gt)})"
        )
    inputs, outputs = gt["inputs"], gt["outputs"]
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs) or not inputs:
        raise ValueError(f"{where}: ground_truth 'inputs' and 'outputs' must be non-empty lists of one length")
    if gt.get("fn_name"):
        return Plan("call", [i if isinstance(i, list) else [i] for i in inputs], outputs, str(gt["fn_name"]))
    as_text = [("\n".join(map(str, x)) if isinstance(x, list) else x) for x in inputs]
    if not all(isinstance(x, str) for x in as_text + outputs):
        raise ValueError(f"{where}: stdin/stdout 'inputs' and 'outputs' must be strings")
    return Plan("stdio", as_text, outputs)


def runner_of(language: str, extra: Mapping[str, Any]) -> Runner:
    runner = RUNNERS.get(language)
    if runner is None:
        raise ValueError(f"{_where(extra)}: no runner for language {language!r} (runners: {', '.join(RUNNERS)})")
    return runner


_FENCE = re.compile(r"```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


def extract_program(response: str, runner: Runner, *, whole_response: bool = False) -> str:
    """The last fenced block in the runner's language (or unlabelled), the whole response when configured;
    "" when there is none."""
    if whole_response:
        return response if response.strip() else ""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(response)]
    mine = [body for lang, body in blocks if lang in runner.fences] or [body for lang, body in blocks if not lang]
    return mine[-1] if mine and mine[-1].strip() else ""


def _tokens(text: str) -> list[list[str]]:
    lines = [line.split() for line in text.strip().splitlines()]
    return [t for t in lines if t] if any(lines) else []


def _same_token(a: str, b: str, tol: float) -> bool:
    if a == b:
        return True
    if tol <= 0:
        return False
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return math.isclose(x, y, rel_tol=tol, abs_tol=tol)


def same_stdout(got: str, expected: str, float_tol: float = 0.0) -> bool:
    """Equal line by line, whitespace-insensitive within and around lines (blank lines ignored); numbers
    within ``float_tol`` (relative or absolute) when it is set."""
    a, b = _tokens(got), _tokens(expected)
    return len(a) == len(b) and all(
        len(x) == len(y) and all(_same_token(s, t, float_tol) for s, t in zip(x, y)) for x, y in zip(a, b)
    )


def _plain(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, frozenset):
        return sorted(map(repr, x))
    return x


def _close(a: Any, b: Any, tol: float) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or (tol > 0 and math.isclose(a, b, rel_tol=tol, abs_tol=tol))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], tol) for k in a)
    return type(a) is type(b) and a == b


def same_value(got: Any, expected: Any, float_tol: float = 0.0) -> bool:
    """A returned value (already decoded to plain data in the parent) against the expected one: tuples
    as lists, APPS's one-element wrapping ``[value]`` accepted, numbers within ``float_tol``."""
    a, b = _plain(got), _plain(expected)
    return _close(a, b, float_tol) or (isinstance(b, list) and len(b) == 1 and _close(a, b[0], float_tol))
