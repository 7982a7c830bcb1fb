"""Recipes shipped with ARMOR: whole run configs, run by name with ``armor run recipe:NAME``.

A recipe is a YAML file in this folder, read exactly like a config file given by path (overrides
after it still apply: ``armor run recipe:cross_domain trainer.total_steps=50``). Each one says at
its top what it trains and what it was measured to do.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["RECIPE_PREFIX", "recipe_names", "recipe_path"]

RECIPE_PREFIX = "recipe:"


def _folder() -> Path:
    return Path(str(resources.files(__name__)))


def recipe_names() -> list[str]:
    """The names ``recipe:NAME`` accepts: the YAML files shipped in this folder, without ``.yaml``."""
    return sorted(p.stem for p in _folder().glob("*.yaml"))


def recipe_path(text: str) -> Path:
    """The YAML file that ``recipe:NAME`` names.

    :raises ConfigError: no shipped recipe has that name; the message lists the recipes.
    """
    from armor_core.config.schema import ConfigError

    name = text[len(RECIPE_PREFIX) :] if text.startswith(RECIPE_PREFIX) else text
    path = _folder() / f"{name}.yaml"
    if not name or "/" in name or not path.is_file():
        known = ", ".join(RECIPE_PREFIX + n for n in recipe_names()) or "none are installed"
        raise ConfigError(
            f"unknown recipe {text!r}; recipes shipped with ARMOR: {known}. A config file is given by its path "
            "(my_run.yaml)"
        )
    return path
