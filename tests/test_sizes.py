"""Sizes (ARCHITECTURE.md rule 10): outside ``benchmarks/`` and ``tests/``, a module over 400 lines or a function over
60 (counted with ``ast``, docstrings included) says why in one line of its module docstring: ``Long module: ...``, or
``Long function: ...`` naming the function. The scan takes a directory, so the last test plants an offender."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE, MAX_FUNCTION = 400, 60
#: modules still without their reason, each with why; the test fails when one no longer needs to be here
PENDING: dict[str, str] = {}


def _sources(root: Path) -> list[Path]:
    dirs = [root / "armor_core", root / "armor_plugins"]
    dirs += [outer / outer.name for outer in sorted(root.glob("armor_rewards_*")) if (outer / outer.name).is_dir()]
    return [p for d in dirs for p in sorted(d.rglob("*.py")) if "templates" not in p.parts]


def offenders(root: Path) -> list[str]:
    """``path: what is too long`` for every module or function over the limits whose module docstring does not
    say why."""
    out = []
    for path in _sources(root):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        reasons = [line for line in (ast.get_docstring(tree) or "").splitlines() if line.startswith("Long ")]
        rel = path.relative_to(root).as_posix()
        if len(text.splitlines()) > MAX_MODULE and not any(r.startswith("Long module:") for r in reasons):
            out.append(f"{rel}: {len(text.splitlines())} lines")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION and not any(
                    r.startswith("Long function:") and node.name in r for r in reasons
                ):
                    out.append(f"{rel}: {node.name} is {length} lines")
    return out


def test_every_long_module_and_function_says_why():
    found = offenders(ROOT)
    assert [f for f in found if f.split(":")[0] not in PENDING] == []
    assert {f.split(":")[0] for f in found} >= set(PENDING), "drop from PENDING what no longer needs to be there"


def test_a_planted_long_function_is_reported_until_it_says_why(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION + 1))
    module = tmp_path / "armor_core" / "m.py"
    module.parent.mkdir()
    module.write_text(f'"""A module."""\n\n\ndef f():\n{body}\n', encoding="utf-8")
    assert offenders(tmp_path) == [f"armor_core/m.py: f is {MAX_FUNCTION + 2} lines"]
    module.write_text(f'"""A module.\n\nLong function: ``f``, planted.\n"""\n\n\ndef f():\n{body}\n', encoding="utf-8")
    assert offenders(tmp_path) == []
