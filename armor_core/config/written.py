"""The config as the user wrote it, for what leaves the machine: trackers log ``${...}`` values unresolved.

``${oc.env:WANDB_API_KEY}`` resolves to the secret itself, and wandb or MLflow would store it as a run
parameter for anyone with access to the project to read. ``load_config`` remembers, for every value
that was an interpolation, the text written (``remember``); ``for_trackers`` is a copy of the resolved
config with those values put back as written. The run itself, its workers and ``config.json`` in the
run directory use the resolved values.
"""

from __future__ import annotations

import copy
from typing import Any

from omegaconf import DictConfig, OmegaConf

__all__ = ["for_trackers", "remember"]

_ATTR = "_armor_written"  # on the ArmorConfig instance: {path: text as written}


def _interpolations(node: Any, path: tuple = ()) -> dict[tuple, str]:
    """``{path: text}`` for every string leaf of the unresolved ``node`` that holds a ``${...}``."""
    if isinstance(node, dict):
        return {p: t for k, v in node.items() for p, t in _interpolations(v, (*path, k)).items()}
    if isinstance(node, list):
        return {p: t for i, v in enumerate(node) for p, t in _interpolations(v, (*path, i)).items()}
    return {path: node} if isinstance(node, str) and "${" in node else {}


def remember(cfg: Any, merged: DictConfig) -> None:
    """Keep on ``cfg`` (resolved from ``merged``) the text of every value of ``merged`` that was an interpolation."""
    written = _interpolations(OmegaConf.to_container(merged, resolve=False))
    object.__setattr__(cfg, _ATTR, written)


def for_trackers(cfg: Any) -> Any:
    """A copy of ``cfg`` whose interpolated values are the text written (``${oc.env:KEY}``), not what it
    resolved to; ``cfg`` itself unchanged."""
    written = getattr(cfg, _ATTR, {})
    if not written:
        return cfg
    out = copy.deepcopy(cfg)
    for path, text in written.items():
        node = out
        for part in path[:-1]:
            node = node[part] if isinstance(node, (dict, list)) else getattr(node, part)
        if isinstance(node, (dict, list)):
            node[path[-1]] = text
        else:
            setattr(node, path[-1], text)
    return out
