"""``armor new {guard,reward,estimator} NAME [--out DIR]``: start a plugin from a working template.

Writes ``DIR/armor-NAME/``, a pip-installable package: ``pyproject.toml`` with the entry point
``NAME`` in group ``armor``, the plugin module ``armor_NAME/__init__.py`` (a small working example
whose docstring is the contract for its kind, taken from ``hookspecs.py`` and ``interfaces.py`` of
the installed ARMOR), a test using ``armor_core.testing``, and a README. The templates are in
``armor_core/cli/templates/``.
"""

from __future__ import annotations

import argparse
import inspect
import keyword
import re
import textwrap
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from string import Template

from armor_core.errors import UserFacingError

__all__ = ["KINDS", "contract_text", "write_plugin"]


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
        help="write a new plugin package (guard, reward domain or advantage estimator) from a template",
        description="Write DIR/armor-NAME/: a pip-installable plugin package with the entry point NAME in group "
        "`armor`, a working example whose docstring is the contract for its kind, a test using "
        "armor_core.testing and a README. Then: cd DIR/armor-NAME && pip install -e . && python -m "
        "pytest && armor plugins.",
    )
    p.add_argument(
        "kind",
        choices=sorted(KINDS),
        help="guard (stability guard), reward (reward domain) or estimator (advantage estimator)",
    )
    p.add_argument(
        "name", help="the plugin's name, the value users write in the config: lowercase snake_case, e.g. my_guard"
    )
    p.add_argument("--out", default=".", help="directory to write the package into (default: the current directory)")
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
        stages = [
            textwrap.fill(f"- ``{stage}`` ({where}): {keys}", width=100, subsequent_indent="  ")
            for stage, (where, keys, _) in interfaces.GUARD_STAGES.items()
        ]
        parts.append("Stages (``interfaces.GUARD_STAGES``):\n\n" + "\n".join(stages))
        parts.append(f"Coefficients an ``adjust`` verdict may set: {', '.join(interfaces.ADJUSTABLE_COEFFICIENTS)}.")
    return _docstring_safe("\n\n".join(parts))


def _class_name(name: str) -> str:
    camel = "".join(part.capitalize() for part in name.split("_") if part)
    return camel if camel.endswith("Guard") else camel + "Guard"


def _check_name(kind: str, name: str, target: Path) -> None:
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name) or keyword.iskeyword(name):
        suggestion = re.sub(r"\W", "_", name.lower()).lstrip("0123456789") or "my_plugin"
        raise UserFacingError(
            f"armor new {kind}: NAME {name!r} is not a lowercase Python identifier (letters, digits and underscores, "
            f"not starting with a digit, not a keyword); it is the value users write in the config. Try {suggestion!r}"
        )
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
    _check_name(kind, name, target)
    module = f"armor_{name}"
    values = {
        "name": name,
        "module": module,
        "dist": target.name,
        "cls": _class_name(name),
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
    for rel, template in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(template.read_text()).substitute(values))
    return target


def main(args: argparse.Namespace) -> int:
    target = write_plugin(args.kind, args.name, args.out)
    kind = KINDS[args.kind].plugin_kind
    print(
        f"wrote {target}: pyproject.toml, armor_{args.name}/__init__.py, tests/test_{args.name}.py, README.md\n"
        f"next: cd {target} && pip install -e . && python -m pytest && armor plugins --kind {kind}"
    )
    return 0
