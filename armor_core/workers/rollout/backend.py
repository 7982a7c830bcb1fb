"""``build_rollout``: the rollout a worker generates with (the actor's colocated one, the async rollout worker's,
``armor eval``'s): the configured backend, wrapped in ``MultiTurnRollout`` when episodes have several turns."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from armor_core.workers.rollout.multi_turn import MultiTurnRollout

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from armor_core.config.schema import RolloutConfig
    from armor_core.interfaces import RolloutBackend

__all__ = ["build_rollout"]


def build_rollout(
    backend_cls: type[RolloutBackend], model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, config: RolloutConfig
) -> RolloutBackend | MultiTurnRollout:
    """The configured rollout: ``backend_cls(model, tokenizer, config)``, wrapped in ``MultiTurnRollout``
    when ``config.multi_turn.enable``."""
    backend = backend_cls(model, tokenizer, config)
    mt = getattr(config, "multi_turn", None)
    if mt is None or not mt.enable:
        return backend
    from armor_core.plugins import get_plugin_manager

    env_cls = get_plugin_manager().get("environment", mt.environment, where="rollout.multi_turn.environment")
    return MultiTurnRollout(backend, tokenizer, config, env_cls)
