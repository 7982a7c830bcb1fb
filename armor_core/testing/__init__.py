"""Helpers for plugin authors' tests.

Register a plugin for the duration of a test, without installing anything, and check an
implementation against the contract the trainer relies on (``check_advantage_estimator``,
``check_policy_loss``, ``check_reward_domain``, ``check_guard`` and one ``check_*`` for every
other plugin kind, listed in ``CHECKS``)::

    from armor_core import hookimpl
    from armor_core.hookspecs import RegisterAdvantageEstimator
    from armor_core.testing import registered, check_advantage_estimator

    class MyPlugin:
        @hookimpl
        def armor_register_advantage_estimators(self, register: RegisterAdvantageEstimator) -> None:
            register("centered", compute_centered_advantage)

    def test_centered():
        with registered(MyPlugin()) as pm:
            est = pm.get("advantage_estimator", "centered")
            check_advantage_estimator(est)

Inside ``registered`` the plugin is visible everywhere ARMOR looks plugins up in this process
(``get_plugin``, config validation, ``armor plugins`` run in-process); afterwards it is gone, so the
suite never depends on what happened to be installed.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from armor_core import plugins as _plugins
from armor_core.testing.batches import left_padded_batch, rollout_batch, run_ranks, shared_prompt_batch
from armor_core.testing.checks import (
    CHECKS,
    GUARD_STATS,
    check_advantage_estimator,
    check_environment,
    check_guard,
    check_kl_estimator,
    check_loss_aggregation,
    check_metric_tracker,
    check_policy_loss,
    check_reward_domain,
    check_rollout_backend,
    check_task,
)

__all__ = [
    "CHECKS",
    "GUARD_STATS",
    "check_advantage_estimator",
    "check_environment",
    "check_guard",
    "check_kl_estimator",
    "check_loss_aggregation",
    "check_metric_tracker",
    "check_policy_loss",
    "check_reward_domain",
    "check_rollout_backend",
    "check_task",
    "isolated_plugin_manager",
    "left_padded_batch",
    "registered",
    "rollout_batch",
    "run_ranks",
    "shared_prompt_batch",
]


@contextlib.contextmanager
def registered(*plugin_objects: Any, load_entrypoints: bool = True) -> Iterator[_plugins.PluginManager]:
    """Make ``plugin_objects`` visible to the process-wide plugin manager for the ``with`` block.

    :param load_entrypoints: also keep the installed plugins (False gives a manager with only yours).
    """
    saved = _plugins._default
    pm = _plugins.PluginManager(load_entrypoints=load_entrypoints)
    for obj in plugin_objects:
        pm.register(obj)
    _plugins._default = pm
    try:
        yield pm
    finally:
        _plugins._default = saved


@contextlib.contextmanager
def isolated_plugin_manager() -> Iterator[_plugins.PluginManager]:
    """A process-wide manager with no plugins at all; register yours with ``pm.register``."""
    with registered(load_entrypoints=False) as pm:
        yield pm
