"""``armor new {guard,reward,estimator,environment} NAME [--out DIR]``: start a plugin from a working template.

Writes ``DIR/armor-NAME/``, a pip-installable package: ``pyproject.toml`` with the entry point
``NAME`` in group ``armor``, the plugin module ``armor_NAME/__init__.py`` (a small working example
whose docstring is the contract for its kind, taken from ``hookspecs.py`` and ``interfaces.py`` of
the installed ARMOR), a test using ``armor_core.testing``, and a README. The templates are in
``armor_core/cli/templates/``. ``armor new environment NAME --adapter {gym,textarena,mcp}`` writes a
package played by a built-in environment instead (``new_adapter.py``).
"""

from __future__ import annotations

import argparse
import inspect
import keyword
import re
import shutil
import textwrap
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Mapping, get_args

from armor_core.errors import UserFacingError
from armor_core.interfaces import GuardStage, VerdictAction

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable  # Python 3.11+; only named in annotations

__all__ = ["KINDS", "check_name", "contract_text", "write_files", "write_plugin"]


@dataclass(frozen=True)
class _Kind:
    plugin_kind: str  # the catalog's kind (armor plugins --kind)
    hook: str
    types: tuple[str, ...]  # interfaces whose docstrings complete the hook's
    summary: str


KINDS = {
    "guard": _Kind(
        "stability_guard",
        "armor_register_stability_guards",
        ("StabilityGuard", "Verdict"),
        "skips an update whose gradient norm exceeds a limit",
    ),
    "reward": _Kind(
        "reward_domain",
        "armor_register_reward_domains",
        ("RewardDomain", "RewardResult"),
        "1 when the response's last word is the ground truth",
    ),
    "environment": _Kind(
        "environment",
        "armor_register_environments",
        ("Environment", "AssistantTurn", "EnvironmentStep"),
        "a number-guessing game answering each guess with higher, lower or correct",
    ),
    "estimator": _Kind(
        "advantage_estimator",
        "armor_register_advantage_estimators",
        ("AdvantageEstimator",),
        "each response's score minus the mean score of its prompt's samples",
    ),
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "new",
        help="write a new plugin package (guard, reward domain, advantage estimator or environment) from a template",
        description="Write DIR/armor-NAME/: a pip-installable plugin package with the entry point NAME in group "
        "`armor`, a working example whose docstring is the contract for its kind, a test using "
        "armor_core.testing and a README. Then: cd DIR/armor-NAME && pip install -e '.[test]' && "
        "python -m pytest && armor plugins.",
    )
    p.add_argument(
        "kind",
        choices=sorted(KINDS),
        help="guard (stability guard), reward (reward domain), estimator (advantage estimator) or environment "
        "(multi-turn rollouts)",
    )
    p.add_argument(
        "name", help="the plugin's name, the value users write in the config: lowercase snake_case, e.g. my_guard"
    )
    p.add_argument("--out", default=".", help="directory to write the package into (default: the current directory)")
    p.add_argument(
        "--adapter",
        metavar="{gym,textarena,mcp}",
        help="environment only: a package played by a built-in environment instead of a new plugin, with a "
        "config.yaml for `armor run`: gym (a text game with gymnasium's reset/step, played by gym_text), textarena "
        "(a textarena game by its id, no code) or mcp (an MCP stdio server whose tools the tools environment offers)",
    )
    p.add_argument(
        "--env-id",
        metavar="ID",
        help="with --adapter textarena: the game of textarena's registry (default: GuessTheNumber-v0)",
    )
    p.set_defaults(func=main)


def _docstring_safe(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"""', '\\"\\"\\"')


def contract_text(kind: str) -> str:
    """The contract for ``kind`` as the installed ARMOR states it: the hook's docstring, the
    docstrings of the types it registers, and for guards the stages and what can be adjusted."""
    from armor_core import hookspecs, interfaces

    spec = KINDS[kind]
    parts = [f"Hook ``{spec.hook}``: {inspect.getdoc(getattr(hookspecs, spec.hook))}"]
    parts += [f"``{name}``: {inspect.getdoc(getattr(interfaces, name))}" for name in spec.types]
    if kind == "guard":
        stages = [_stage_text(name, stage) for name, stage in interfaces.GUARD_STAGES.items()]
        parts.append("Stages (``interfaces.GUARD_STAGES``), in the order of a step:\n\n" + "\n".join(stages))
        parts.append(f"Coefficients an ``adjust`` verdict may set: {', '.join(interfaces.ADJUSTABLE_COEFFICIENTS)}.")
    return _docstring_safe("\n\n".join(parts))


def _stage_text(name: str, stage: GuardStage) -> str:
    """One guard stage of the table in words: where it runs, its statistics, and what its verdicts do."""
    lines = [f"- ``{name}`` ({stage.where}). Statistics: {', '.join(stage.keys)}."]
    if stage.optional:
        lines.append("In some runs: " + "; ".join(f"{k} ({when})" for k, when in stage.optional.items()) + ".")
    lines += [f"Also ``{prefix}*``: {what}." for prefix, what in stage.families.items()]
    lines.append("Honours: " + "; ".join(f"``{a}``: {what}" for a, what in stage.honours.items()) + ".")
    refused = [a for a in get_args(VerdictAction) if not stage.honoured(a)]
    if refused:
        lines.append(f"Cannot honour (a guard returning it is refused): {', '.join(refused)}.")
    indents = [""] + ["  "] * (len(lines) - 1)
    return "\n".join(
        textwrap.fill(line, width=100, initial_indent=first, subsequent_indent="  ")
        for line, first in zip(lines, indents)
    )


def _class_name(name: str, suffix: str = "Guard") -> str:
    camel = "".join(part.capitalize() for part in name.split("_") if part)
    return camel if camel.endswith(suffix) else camel + suffix


#: a plugin name is lowercase snake_case: each word starts with a letter, single underscores between
#: words. Then ``armor-NAME`` is a valid PEP 508 project name that normalises back to it (PEP 503
#: folds runs of ``-_.``, so ``_x`` and ``x`` would both be ``armor-x``), and ``armor_NAME`` a module.
_SNAKE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")
#: PEP 508's project name grammar, for the distribution name ``armor-NAME``
_PEP508_NAME = re.compile(r"[a-z0-9]|[a-z0-9][a-z0-9._-]*[a-z0-9]", re.IGNORECASE)
#: longest NAME: the test file ``tests/test_NAME.py`` must fit a 255-byte file name with room to spare
MAX_NAME = 64


def _normalized(dist: str) -> str:
    """A distribution name as PEP 503 compares them: lowercase, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", dist).lower()


def _syntax_problem(name: str) -> str | None:
    """Why ``name`` cannot be a plugin name, or None."""
    if len(name) > MAX_NAME:
        return f"has {len(name)} characters; at most {MAX_NAME} (it names a directory, a module and a file)"
    if not _SNAKE.fullmatch(name) or keyword.iskeyword(name):
        return (
            "is not lowercase snake_case (words of lowercase letters and digits, each starting with a letter, "
            "joined by single underscores; not a Python keyword)"
        )
    if not _PEP508_NAME.fullmatch(f"armor-{name.replace('_', '-')}"):
        return "does not make a valid PEP 508 project name"
    return None


def _collision(name: str) -> str | None:
    """What already installed or importable thing ``armor-NAME`` / ``armor_NAME`` would collide with, or None."""
    import importlib.util

    dist, module = f"armor-{name.replace('_', '-')}", f"armor_{name}"
    for d in metadata.distributions():
        other = d.metadata["Name"] or ""
        if _normalized(other) == _normalized(dist):
            return (
                f"its distribution {dist!r} is already installed ({other} {d.version}); the printed `pip install -e .` "
                "would replace it"
            )
    try:
        spec = importlib.util.find_spec(module)  # a top-level name: nothing is imported
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        where = spec.origin or ", ".join(spec.submodule_search_locations or []) or "built in"
        return f"its module {module!r} is already importable ({where}); the new package would shadow it or be shadowed"
    return None


def _suggestion(name: str) -> str | None:
    """A valid name close to ``name`` that collides with nothing, or None (never ``name`` itself)."""
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    candidate = "_".join(words).lstrip("0123456789_")[:MAX_NAME].rstrip("_")
    if not candidate or candidate == name or _syntax_problem(candidate) or _collision(candidate):
        return None
    if candidate in {ep.name for ep in metadata.entry_points(group="armor")}:
        return None
    return candidate


def check_name(kind: str, name: str, target: Path) -> None:
    problem = _syntax_problem(name)
    if problem is not None:
        suggestion = _suggestion(name)
        shown = name if len(name) <= MAX_NAME else name[:MAX_NAME] + "..."
        raise UserFacingError(
            f"armor new {kind}: NAME {shown!r} {problem}; it is the value users write in the config"
            + (f". Try {suggestion!r}" if suggestion else f", e.g. my_{kind}")
        )
    collision = _collision(name)
    if collision is not None:
        raise UserFacingError(f"armor new {kind}: NAME {name!r}: {collision}. Choose another NAME")
    taken = {ep.name: ep.value for ep in metadata.entry_points(group="armor")}
    if name in taken:
        raise UserFacingError(
            f"armor new {kind}: the entry point {name!r} is already installed ({taken[name]}); ARMOR would load "
            "only one of the two. Choose another NAME"
        )
    from armor_core.plugins import get_plugin_manager

    spec = KINDS[kind]
    if name in get_plugin_manager().names(spec.plugin_kind):
        raise UserFacingError(
            f"armor new {kind}: a {spec.plugin_kind} named {name!r} is already registered (armor plugins --kind "
            f"{spec.plugin_kind}); two plugins may not register one name. Choose another NAME"
        )
    if target.exists():
        raise UserFacingError(
            f"armor new {kind}: {target} already exists; nothing was written. Choose another NAME or --out DIR"
        )


def write_plugin(kind: str, name: str, out: str | Path = ".") -> Path:
    """Write the package for a ``kind`` plugin called ``name`` under ``out``; returns its directory."""
    from armor_core import __version__

    target = Path(out) / f"armor-{name.replace('_', '-')}"
    check_name(kind, name, target)
    module = f"armor_{name}"
    values = {
        "name": name,
        "module": module,
        "dist": target.name,
        "cls": _class_name(name),
        "class_name": _class_name(name, "Environment"),
        "version": __version__,
        "summary": KINDS[kind].summary,
        "contract": contract_text(kind),
    }
    templates = resources.files("armor_core.cli") / "templates"
    files = {
        "pyproject.toml": templates / "pyproject.toml.tmpl",
        f"{module}/__init__.py": templates / kind / "plugin.py.tmpl",
        f"tests/test_{name}.py": templates / kind / "test.py.tmpl",
        "README.md": templates / kind / "README.md.tmpl",
    }
    write_files(kind, target, files, values)
    return target


def write_files(kind: str, target: Path, files: Mapping[str, Traversable], values: Mapping[str, str]) -> None:
    """Each template of ``files`` (relative path -> template) filled with ``values`` under ``target``; on a
    failure nothing is left behind and the error says so."""
    try:
        for rel, template in files.items():
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(Template(template.read_text()).substitute(values))
    except OSError as e:  # --out is a file, read-only, on a full disk: nothing half-written is left
        shutil.rmtree(target, ignore_errors=True)
        raise UserFacingError(
            f"armor new {kind}: cannot write {target} ({e.strerror or e}); nothing was written"
        ) from e


def main(args: argparse.Namespace) -> int:
    from armor_core.cli.new_adapter import check_adapter_args, write_adapter

    check_adapter_args(args.kind, args.adapter, args.env_id)
    if args.adapter is not None:
        target = write_adapter(args.name, args.adapter, args.out, args.env_id)
        written = ", ".join(sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()))
        print(
            f"wrote {target}: {written}\n"
            f"next: cd {target} && pip install -e '.[test]' && python -m pytest && armor run config.yaml --dry-run"
        )
        return 0
    target = write_plugin(args.kind, args.name, args.out)
    kind = KINDS[args.kind].plugin_kind
    print(
        f"wrote {target}: pyproject.toml, armor_{args.name}/__init__.py, tests/test_{args.name}.py, README.md\n"
        f"next: cd {target} && pip install -e '.[test]' && python -m pytest && armor plugins --kind {kind}"
    )
    return 0
