"""``armor new environment NAME --adapter {gym,textarena,mcp}``: a package built on one of ARMOR's adapters.

Where ``armor new environment NAME`` writes an environment plugin from scratch, ``--adapter`` writes a
package that registers nothing and is played by a built-in environment, with a ``config.yaml`` for
``armor run``, its README (the config's part that names the game or server) and a test that checks the
config as ``armor run`` does at start:

- ``gym``: ``armor_NAME/game.py``, a small word game with gymnasium's ``reset``/``step`` API over text and
  its factory ``make``, played by ``gym_text`` (``factory: armor_NAME.game:make``);
- ``textarena``: no code, the config of ``textarena`` for one game of its registry (``--env-id``);
- ``mcp``: ``armor_NAME/server.py``, a stdio MCP server on the ``mcp`` SDK's server API, served by the
  ``tools`` environment (``mcp_servers``).

The templates are in ``armor_core/cli/templates/adapters/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from armor_core.errors import UserFacingError

__all__ = ["ADAPTERS", "DEFAULT_ENV_ID", "check_adapter_args", "write_adapter"]

DEFAULT_ENV_ID = "GuessTheNumber-v0"


@dataclass(frozen=True)
class _Adapter:
    environment: str  # the built-in environment that plays the package
    extra: str  # armor-rl's optional extra the package depends on
    code: tuple[str, ...]  # module files besides __init__.py (template stems, written as armor_NAME/<stem>.py)
    summary: str


ADAPTERS = {
    "gym": _Adapter("gym_text", "games", ("game",), "a word game with gymnasium's API, played by gym_text"),
    "textarena": _Adapter("textarena", "games", (), "a textarena game played by ARMOR's textarena environment"),
    "mcp": _Adapter("tools", "mcp", ("server",), "an MCP server whose tools the tools environment offers"),
}


def check_adapter_args(kind: str, adapter: str | None, env_id: str | None) -> None:
    """A one-line ``UserFacingError`` for ``--adapter`` or ``--env-id`` where they do not apply or are unknown."""
    if adapter is not None and kind != "environment":
        raise UserFacingError(f"armor new {kind}: --adapter applies only to `armor new environment`")
    if adapter is not None and adapter not in ADAPTERS:
        raise UserFacingError(
            f"armor new environment: unknown --adapter {adapter!r}; choose one of {', '.join(ADAPTERS)}"
        )
    if env_id is not None and adapter != "textarena":
        raise UserFacingError(f"armor new {kind}: --env-id applies only to `--adapter textarena`")


def _check_env_id(env_id: str) -> None:
    """textarena's registry has ``env_id`` (checked by the ``textarena`` environment itself, nearest id named)."""
    from armor_core.interfaces import capability
    from armor_core.plugins import get_plugin_manager

    env_cls = get_plugin_manager().get("environment", "textarena", where="armor new environment --adapter textarena")
    check = capability("environment", env_cls, "check_params")
    try:
        if check is not None:
            check(env_id=env_id)
    except (ValueError, ImportError) as e:
        raise UserFacingError(f"armor new environment --adapter textarena: --env-id {env_id!r}: {e}") from None


def write_adapter(name: str, adapter: str, out: str | Path = ".", env_id: str | None = None) -> Path:
    """Write the ``adapter`` package called ``name`` under ``out``; returns its directory."""
    from armor_core import __version__
    from armor_core.cli.new import check_name, write_files

    check_adapter_args("environment", adapter, env_id)
    spec = ADAPTERS[adapter]
    target = Path(out) / f"armor-{name.replace('_', '-')}"
    check_name("environment", name, target)
    env_id = env_id or DEFAULT_ENV_ID
    if adapter == "textarena":
        _check_env_id(env_id)
    module = f"armor_{name}"
    values = {
        "name": name,
        "module": module,
        "dist": target.name,
        "version": __version__,
        "summary": spec.summary if adapter != "textarena" else f"textarena's {env_id} played by ARMOR",
        "environment": spec.environment,
        "extra": spec.extra,
        "packages": f'["{module}"]' if spec.code else "[]",
        "env_id": env_id,
    }
    templates = resources.files("armor_core.cli") / "templates" / "adapters"
    files = {
        "pyproject.toml": templates / "pyproject.toml.tmpl",
        "config.yaml": templates / adapter / "config.yaml.tmpl",
        f"tests/test_{name}.py": templates / adapter / "test.py.tmpl",
        "README.md": templates / adapter / "README.md.tmpl",
    }
    if spec.code:
        files[f"{module}/__init__.py"] = templates / adapter / "init.py.tmpl"
        files.update({f"{module}/{stem}.py": templates / adapter / f"{stem}.py.tmpl" for stem in spec.code})
    write_files("environment", target, files, values)
    return target
