"""Import directions (ARCHITECTURE.md rule 1), checked on the source: every ``import`` of every ``.py`` file
of ``armor_core``, ``armor_plugins`` and the reward packs, read with ``ast``, function-level ones too.

(a) ``armor_core`` imports neither ``armor_plugins`` nor a reward pack.
(b) Plugins and packs import only the core's public modules, ``PUBLIC`` below.
(c) A pack imports neither ``armor_plugins`` nor another pack.
(d) No import cycle between files of different sub-packages of ``armor_core`` (the graph of its modules,
    module- and function-level imports, nothing collapsed), and every import between two sub-packages
    goes down ``LAYERS``, except the few ``EXCEPTIONS`` named with their reason.

The checker takes a directory, so the last tests plant each kind of violation in a fake tree and see it
reported.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = "armor_core"
PLUGINS = "armor_plugins"
PACK_PREFIX = "armor_rewards_"

#: what plugins and packs may import from the core: these modules, and under a name ending in ``*`` the
#: module with everything below it. The contract (``hookspecs``, ``interfaces``, ``plugins``, ``errors``,
#: and ``armor_core`` itself, which re-exports them), the test helpers for plugin authors, the batch
#: container, the tensor and reward helpers, model loading and LoRA (rollout backends use them), and the
#: guard authors' helpers (``stability.helpers``; the guard runner beside it stays private).
PUBLIC = (
    "armor_core",
    "armor_core.hookspecs",
    "armor_core.interfaces",
    "armor_core.plugins",
    "armor_core.errors",
    "armor_core.testing*",
    "armor_core.dataproto*",
    "armor_core.ops*",
    "armor_core.models*",
    "armor_core.stability.helpers",
)

#: the sub-packages of ``armor_core``, lowest first; ``contract`` is the top-level modules (``hookspecs``,
#: ``interfaces``, ``plugins``, ``errors``, ``__init__``). A module may import from its own sub-package and
#: from any lower layer, never from its own layer's other members or from above. Read the real graph
#: this way: the ``cli`` parses arguments and drives the ``loop`` and the supervised trainers of ``train``
#: (``armor sft``, ``armor rm train``), which sit beside the loop (``testing`` builds on the loop for plugin
#: authors); the loop drives the ``workers``, which run on the ``engine`` and keep their state through ``storage``; the
#: driver scores with ``rewards``; all of them read ``config``; the guard runner and fault injection
#: (``stability``) serve both the driver and the actor ranks and know only the contract.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("ops", "dataproto"),
    ("contract",),
    ("stability",),
    ("config", "models", "report"),
    ("rewards", "storage", "engine"),
    ("workers",),
    ("loop", "train"),
    ("testing",),
    ("cli",),
)

#: imports that go against ``LAYERS``, each with its reason; the test fails when one is no longer needed,
#: so the list cannot rot. None today.
EXCEPTIONS: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module, or the deepest module of the tree it names
    where: str  # path:line


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_dirs(root: Path) -> dict[str, Path]:
    """``{package: its directory}``: the core, the plugins, each pack (``armor_rewards_x/armor_rewards_x``)."""
    dirs = {name: root / name for name in (CORE, PLUGINS) if (root / name).is_dir()}
    for outer in sorted(root.glob(f"{PACK_PREFIX}*")):
        if (outer / outer.name / "__init__.py").is_file():
            dirs[outer.name] = outer / outer.name
    return dirs


def read_imports(root: Path) -> tuple[dict[str, list[Import]], set[str]]:
    """Every import of every module of the packages under ``root``, and the set of those modules' names."""
    files: dict[str, Path] = {}
    for directory in _package_dirs(root).values():
        for path in sorted(directory.rglob("*.py")):
            files[_module_name(path, directory.parent)] = path
    modules = set(files)
    out: dict[str, list[Import]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        found = out[module] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                found += [Import(module, a.name, where) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the module's package, one level up per extra dot
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    parent = ".".join(base + ([node.module] if node.module else []))
                else:
                    parent = node.module or ""
                for a in node.names:  # `from pkg import mod` imports the module pkg.mod when there is one
                    child = f"{parent}.{a.name}"
                    found.append(Import(module, child if child in modules else parent, where))
    return out, modules


def _top(name: str) -> str:
    return name.split(".")[0]


def _is_pack(name: str) -> bool:
    return _top(name).startswith(PACK_PREFIX)


def _is_public(target: str) -> bool:
    return any(target == p.rstrip("*") or (p.endswith("*") and target.startswith(p.rstrip("*") + ".")) for p in PUBLIC)


def sub_package(module: str, modules: set[str]) -> str:
    """The sub-package of a core module: ``loop`` for ``armor_core.loop.step``, ``contract`` for the top level."""
    parts = module.split(".")
    if len(parts) > 1 and any(m.startswith(f"{CORE}.{parts[1]}.") for m in modules):
        return parts[1]
    return "contract"


def _owner(target: str, modules: set[str]) -> str | None:
    """The deepest module of the tree that ``target`` is or lies in (``armor_core.x.y.attr`` -> ``armor_core.x.y``)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def _layer(sub: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if sub in layer)


def check_tree(root: Path, exceptions: dict[tuple[str, str], str] | None = None) -> list[str]:
    """Every violation of rules (a)-(d) in the packages under ``root``, one line each (empty when none)."""
    exceptions = EXCEPTIONS if exceptions is None else exceptions
    imports, modules = read_imports(root)
    problems: list[str] = []
    graph: dict[str, set[str]] = {}
    for source, found in imports.items():
        for imp in found:
            top, target = _top(source), imp.target
            if top == CORE and (_top(target) == PLUGINS or _is_pack(target)):
                problems.append(f"{imp.where}: (a) the core imports {target}")
            if top != CORE and _top(target) == CORE and not _is_public(target):
                problems.append(f"{imp.where}: (b) {source} imports {target}, not one of the core's public modules")
            if _is_pack(source) and (_top(target) == PLUGINS or (_is_pack(target) and _top(target) != top)):
                problems.append(f"{imp.where}: (c) the pack {top} imports {target}")
            owner = _owner(target, modules) if top == CORE and _top(target) == CORE else None
            if owner is None or owner == source:
                continue
            graph.setdefault(source, set()).add(owner)
            a, b = sub_package(source, modules), sub_package(owner, modules)
            if a != b and _layer(b) >= _layer(a) and (source, owner) not in exceptions:
                problems.append(f"{imp.where}: (d) {a} may not import {b}: {source} imports {owner}")
    problems += [
        f"(d) import cycle across sub-packages: {' -> '.join(c)}" for c in cross_package_cycles(graph, modules)
    ]
    return problems


def cross_package_cycles(graph: dict[str, set[str]], modules: set[str]) -> list[list[str]]:
    """One cycle (a path back to its start) through each import between two sub-packages that lies on a cycle."""
    cycles = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            if sub_package(a, modules) == sub_package(b, modules):
                continue
            path = _path(graph, b, a)
            if path is not None:
                cycles.append([a, *path])
    return cycles


def _path(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    previous: dict[str, str | None] = {start: None}
    queue = [start]
    for node in queue:
        if node == goal:
            path = [node]
            while previous[path[-1]] is not None:
                path.append(previous[path[-1]])
            return path[::-1]
        for nxt in sorted(graph.get(node, ())):
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return None


# -- the real tree -------------------------------------------------------------------------------------


def test_the_packages_keep_the_import_rules():
    assert check_tree(ROOT) == []


def test_every_sub_package_has_a_layer_and_every_exception_is_still_needed():
    imports, modules = read_imports(ROOT)
    subs = {sub_package(m, modules) for m in modules if _top(m) == CORE}
    assert subs == {s for layer in LAYERS for s in layer}, "add a new sub-package to LAYERS"
    real = {(i.source, _owner(i.target, modules)) for found in imports.values() for i in found}
    assert set(EXCEPTIONS) <= real, f"no longer imported, drop from EXCEPTIONS: {set(EXCEPTIONS) - real}"


def test_the_scan_sees_all_the_packs_and_function_level_imports():
    imports, modules = read_imports(ROOT)
    assert {"armor_rewards_code", "armor_rewards_math", "armor_rewards_qa", "armor_rewards_safety"} <= {
        _top(m) for m in modules
    }
    # a function-level import the real tree has (validate_plugins imports the plugin manager when called)
    assert any(i.target.startswith("armor_core.plugins") for i in imports["armor_core.config.plugin_checks"])


# -- the checker on a planted tree ---------------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    for directory in root.rglob("*"):  # every directory is a package but a pack's outer (distribution) one
        if directory.is_dir() and not (directory.parent == root and directory.name.startswith(PACK_PREFIX)):
            (directory / "__init__.py").touch()


CLEAN = {
    "armor_core/__init__.py": "from armor_core.hookspecs import hookimpl\n",
    "armor_core/hookspecs.py": "",
    "armor_core/ops/masked.py": "",
    "armor_core/config/schema.py": "",
    "armor_core/workers/actor.py": "from armor_core.config.schema import x\n",
    "armor_core/loop/trainer.py": "from armor_core.workers import actor\nfrom ..config import schema\n",
    "armor_plugins/grpo.py": "from armor_core import hookimpl\nfrom armor_core.ops.masked import masked_mean\n",
    "armor_plugins/guard.py": "from armor_core.stability.helpers import Knob\n",
    "armor_rewards_a/armor_rewards_a/__init__.py": "from armor_core.models.lora import y\n",
    "armor_rewards_b/armor_rewards_b/__init__.py": "import armor_core.testing.checks\n",
}


def test_a_clean_planted_tree_passes(tmp_path):
    _write(tmp_path, CLEAN)
    assert check_tree(tmp_path, exceptions={}) == []


@pytest.mark.parametrize(
    "rel, text, expected",
    [
        (
            "armor_core/loop/step.py",
            "def f():\n    import armor_plugins.grpo\n",
            "(a) the core imports armor_plugins.grpo",
        ),
        ("armor_core/ops/more.py", "from armor_rewards_a import z\n", "(a) the core imports armor_rewards_a"),
        (
            "armor_plugins/x.py",
            "from armor_core.loop import trainer\n",
            "(b) armor_plugins.x imports armor_core.loop.trainer",
        ),
        ("armor_rewards_a/armor_rewards_a/d.py", "def f():\n    from armor_core.config.schema import C\n", "(b)"),
        (
            "armor_plugins/x.py",
            "from armor_core.stability.guard import GuardRunner\n",
            "(b) armor_plugins.x imports armor_core.stability.guard",
        ),
        (
            "armor_rewards_a/armor_rewards_a/d.py",
            "from armor_plugins.grpo import f\n",
            "(c) the pack armor_rewards_a imports",
        ),
        (
            "armor_rewards_a/armor_rewards_a/d.py",
            "import armor_rewards_b\n",
            "(c) the pack armor_rewards_a imports armor_rewards_b",
        ),
        ("armor_core/config/bad.py", "from armor_core.workers.actor import A\n", "(d) config may not import workers"),
        ("armor_core/workers/w.py", "from ..loop import trainer\n", "(d) workers may not import loop"),
        ("armor_core/hookspecs.py", "from armor_core.config import schema\n", "(d) contract may not import config"),
    ],
)
def test_each_planted_violation_is_reported(tmp_path, rel, text, expected):
    _write(tmp_path, {**CLEAN, rel: text})
    problems = check_tree(tmp_path, exceptions={})
    assert any(expected in p for p in problems), problems


def test_a_planted_cycle_across_sub_packages_is_reported_even_when_excepted(tmp_path):
    # workers.actor -> config.schema (allowed) and config.schema -> workers.actor inside a function
    _write(tmp_path, {**CLEAN, "armor_core/config/schema.py": "def f():\n    from armor_core.workers import actor\n"})
    excepted = {("armor_core.config.schema", "armor_core.workers.actor"): "planted"}
    problems = check_tree(tmp_path, exceptions=excepted)
    assert problems and all(p.startswith("(d) import cycle") for p in problems), problems
    assert "armor_core.config.schema -> armor_core.workers.actor -> armor_core.config.schema" in problems[0]
