"""ARMOR core: the plugin contract, the batch container, the config and the machinery that runs them."""

from armor_core.hookspecs import hookimpl
from armor_core.interfaces import (
    AdvantageEstimator,
    KLEstimator,
    LossAggregation,
    PolicyLoss,
    RewardDomain,
    RewardResult,
    Task,
    Verdict,
)
from armor_core.plugins import get_plugin, list_plugins

__version__ = "0.1.0"

__all__ = [
    "AdvantageEstimator",
    "DataProto",
    "DataProtoItem",
    "KLEstimator",
    "LossAggregation",
    "PolicyLoss",
    "RewardDomain",
    "RewardResult",
    "Task",
    "Verdict",
    "get_plugin",
    "hookimpl",
    "list_plugins",
]


def __getattr__(name: str):
    # DataProto pulls in torch; import it on first use so `armor --help` stays fast
    if name in ("DataProto", "DataProtoItem"):
        from armor_core import dataproto

        return getattr(dataproto, name)
    raise AttributeError(f"module 'armor_core' has no attribute {name!r}")
