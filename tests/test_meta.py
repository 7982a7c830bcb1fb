"""Meta-tests that keep the plugin contract honest (after datasette's tests/test_docs.py and test_plugins.py)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from armor_core import hookspecs
from armor_core.interfaces import KINDS

HOOKS = [name for name, obj in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("armor_")]
TESTS = Path(__file__).parent
ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
PLUGIN_GUIDE = ROOT / "docs" / "plugins.md"  # the hook table a plugin author reads first


def test_hook_list_is_what_the_catalog_knows():
    assert sorted(HOOKS) == sorted(hook for hook, _ in KINDS.values())
    assert sorted(HOOKS) == sorted(n for n in hookspecs.__all__ if n.startswith("armor_"))


def test_every_hook_is_documented():
    for name in HOOKS:
        fn = getattr(hookspecs, name)
        doc = inspect.getdoc(fn) or ""
        assert ":param register:" in doc, f"{name} has no ':param register:' docstring"
        assert "register(name," in doc, f"{name}'s docstring does not say what to register"
        # each hook's registrar is typed for its kind: RegisterAdvantageEstimator for the estimators, ...
        annotation = inspect.signature(fn).parameters["register"].annotation
        assert annotation.startswith("Register") and annotation != "Register", f"{name}: registrar {annotation}"
        assert annotation in hookspecs.__all__ and callable(getattr(hookspecs, annotation))


def test_each_kind_has_its_own_registrar():
    annotations = [inspect.signature(getattr(hookspecs, name)).parameters["register"].annotation for name in HOOKS]
    assert len(set(annotations)) == len(HOOKS)


def test_every_hook_is_in_the_plugin_guide():
    text = PLUGIN_GUIDE.read_text(encoding="utf-8")
    missing = [name for name in HOOKS if f"| `{name}` |" not in text]
    assert missing == [], f"docs/plugins.md's hook table lacks {missing}"


def test_the_readme_links_resolve():
    # the README is the first two minutes and points into docs/: a page moved or renamed must not leave it dangling
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    local = [t for t in targets if "://" not in t]
    assert local, "README.md links to no page"
    dangling = [t for t in local if not (ROOT / t).exists()]
    assert dangling == [], f"README.md links to missing files: {dangling}"


def test_ci_runs_the_readme_test_command_verbatim():
    commands = [line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith("python3.11 ")]
    assert (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()[-1] == commands[-1]


def test_the_getting_started_page_gives_the_readme_commands():
    # the two commands live in the README (CI runs the second); the docs site repeats them, and must not drift
    commands = [line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith("python3.11 ")]
    assert len(commands) == 2
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8").splitlines()
    assert [c for c in commands if c not in page] == []


def test_every_shipped_hookimpl_annotates_its_registrar():
    """Every ``@hookimpl`` of the built-in plugins, the reward packs and the ``armor new`` templates types its
    ``register`` with the hook's own registrar and returns None, so that pyright (CI) checks what it registers."""
    root = TESTS.parent
    files = [*root.glob("armor_plugins/**/*.py"), *root.glob("armor_rewards_*/armor_rewards_*/**/*.py")]
    files += list(root.glob("armor_core/cli/templates/*/plugin.py.tmpl"))
    seen, wrong = 0, []
    for path in files:
        for match in re.finditer(r"@hookimpl\s+def (armor_\w+)\(([^)]*)\)( -> None)?:", path.read_text()):
            hook, params, returns = match.groups()
            seen += 1
            expected = inspect.signature(getattr(hookspecs, hook)).parameters["register"].annotation
            if params != f"register: {expected}" or not returns:
                wrong.append(f"{path.relative_to(root)}: def {hook}({params}){returns or ''}")
    assert seen >= 40, f"found only {seen} hookimpls: the pattern no longer matches the plugins"
    assert wrong == [], "hookimpls without their typed registrar:\n" + "\n".join(wrong)


def test_optional_plugin_capabilities_are_declared_and_read_through_one_helper():
    """Every optional attribute the core reads from a plugin is documented in ``interfaces.CAPABILITIES``, and no
    module reads one with ``getattr``/``hasattr`` by its name: only ``interfaces.capability`` does."""
    from armor_core.interfaces import CAPABILITIES, capability

    assert set(CAPABILITIES) == set(KINDS)
    names = {name for caps in CAPABILITIES.values() for name in caps}
    assert all(cap.doc for caps in CAPABILITIES.values() for cap in caps.values())
    pattern = re.compile(r"(?:getattr|hasattr)\([^,()]+, [\"'](" + "|".join(sorted(names)) + r")[\"']")
    core = TESTS.parent / "armor_core"
    ad_hoc = [
        f"{path.relative_to(core)}:{i}: {line.strip()}"
        for path in core.rglob("*.py")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and "CAPABILITIES[kind][name].default" not in line
    ]
    assert ad_hoc == [], "optional capabilities read ad hoc (use interfaces.capability):\n" + "\n".join(ad_hoc)

    class Fn:
        wants_data_source = True

    assert capability("reward_domain", Fn(), "wants_data_source") is True
    assert capability("reward_domain", lambda *a: 0.0, "wants_data_source") is False
    with pytest.raises(KeyError):
        capability("reward_domain", Fn(), "wants_everything")


def test_every_hook_has_a_test():
    # a hook counts as tested when some test module other than this one implements it
    sources = "\n".join(p.read_text() for p in TESTS.rglob("test_*.py") if p.name != Path(__file__).name)
    untested = [name for name in HOOKS if not re.search(rf"def {name}\(", sources)]
    assert untested == [], f"hooks without a test implementing them: {untested}"


def test_the_core_imports_without_the_built_in_plugins():
    """Every ``armor_core`` module imports (and none reaches for ``armor_plugins`` at import time)
    in a process where importing ``armor_plugins`` fails."""
    import subprocess
    import sys

    code = """
import importlib, importlib.abc, pkgutil, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "armor_plugins" or name.startswith("armor_plugins."):
            raise ImportError("armor_plugins is blocked in this test")
sys.meta_path.insert(0, Block())
import armor_core
names = [m.name for m in pkgutil.walk_packages(armor_core.__path__, "armor_core.")]
for name in names:
    importlib.import_module(name)
loaded = sorted(m for m in sys.modules if m.startswith("armor_plugins"))
assert not loaded, loaded
print(len(names))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) > 30  # every module was walked


def test_the_guard_stage_table_names_every_stage_the_code_shows_a_guard():
    import armor_core
    from armor_core.interfaces import GUARD_STAGES

    root = Path(armor_core.__file__).parent
    shown = set()
    for path in root.rglob("*.py"):
        shown |= set(re.findall(r"""\.observe\(\s*["'](\w+)["']""", path.read_text()))
    assert shown == set(GUARD_STAGES), (sorted(shown), sorted(GUARD_STAGES))


def test_each_worker_class_implements_its_protocol_with_the_same_parameters():
    """``armor_core.workers.api`` is the one declaration of what the driver calls; a worker method
    whose parameters drift from it would take a call the reader of the protocol does not expect."""
    from armor_core.engine import declared_methods
    from armor_core.workers.actor.worker import ActorWorker
    from armor_core.workers.api import ActorAPI, CriticAPI, RolloutAPI, TeacherAPI
    from armor_core.workers.critic.worker import CriticWorker
    from armor_core.workers.rollout.worker import RolloutWorker
    from armor_core.workers.teacher import TeacherWorker

    pairs = (
        (ActorWorker, ActorAPI),
        (CriticWorker, CriticAPI),
        (RolloutWorker, RolloutAPI),
        (TeacherWorker, TeacherAPI),
    )
    for worker, api in pairs:
        for name in declared_methods(api):
            declared = list(inspect.signature(getattr(api, name)).parameters)
            # ray.remote(cls) in this process (an earlier test) adds its tracing parameter to the class's methods
            implemented = [p for p in inspect.signature(getattr(worker, name)).parameters if p != "_ray_trace_ctx"]
            assert implemented == declared, (
                f"{worker.__name__}.{name}{implemented} differs from {api.__name__}.{name}{declared}"
            )


def test_the_driver_names_worker_methods_by_reference_never_by_string():
    calls = re.compile(r"\.(call|dispatch|submit|submit_call|submit_pair|call_rank)\(\s*(\d+,\s*)?[\"']")
    offenders = [
        f"{path}:{i}"
        for path in (TESTS.parent / "armor_core").rglob("*.py")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if calls.search(line)
    ]
    assert not offenders, f"worker methods named by a string (use armor_core.workers.api): {offenders}"
