"""The default guard stack, and what it adds for the model a run trains.

``guard.guards`` left as it is (``DEFAULT_GUARDS``: ``non_finite`` and ``trust_region``) is the default stack; for a
mixture-of-experts model (``config.json`` with routed experts: DeepSeek-V3's ``n_routed_experts``, Qwen3-MoE's
``num_experts``) the trainer adds ``expert_collapse`` (``armor_plugins/guards/expert_collapse.py``), which watches the
experts' load. A list the user sets is the whole stack: nothing is added to it.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DEFAULT_GUARDS", "MOE_GUARD", "is_moe_config", "model_guards"]

DEFAULT_GUARDS = ({"name": "non_finite", "params": {}}, {"name": "trust_region", "params": {}})
MOE_GUARD = {"name": "expert_collapse", "params": {}}


def is_moe_config(config: dict[str, Any]) -> bool:
    """Whether a model's ``config.json`` describes routed experts."""
    return any(int(config.get(key) or 0) > 1 for key in ("n_routed_experts", "num_experts", "num_local_experts"))


def model_guards(cfg: Any) -> list[dict[str, Any]]:
    """``cfg.guard.guards`` with ``expert_collapse`` added when it is the default stack and the model is MoE."""
    from armor_core.models.loading import resolve_model_path

    guards = [dict(g) if isinstance(g, dict) else {"name": str(g), "params": {}} for g in cfg.guard.guards]
    if [g.get("name") for g in guards] != [g["name"] for g in DEFAULT_GUARDS] or any(g.get("params") for g in guards):
        return guards  # the user's own stack
    try:
        path = resolve_model_path(cfg.model.path, need_tokenizer=False) / "config.json"
        config = json.loads(path.read_text())
    except (OSError, ValueError):  # no local config to read: loading the model says what is wrong
        return guards
    return [*guards, dict(MOE_GUARD)] if is_moe_config(config) else guards
