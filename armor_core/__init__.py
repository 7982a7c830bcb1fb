"""ARMOR core: the plugin contract, the batch container, the config and the machinery that runs them."""

from typing import TYPE_CHECKING

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

if TYPE_CHECKING:  # imported on first use below (torch); named here for type checkers
    from armor_core.dataproto import DataProto, DataProtoItem

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
