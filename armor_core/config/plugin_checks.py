"""``validate_plugins``: every plugin name in a config resolved before anything starts (an unknown
one is a ``ConfigError`` naming the key and the nearest name), plus the checks that need the
plugins themselves: grouped estimators for ``filter_groups`` and ``normalize_components``, a
backend that can run in a worker of its own for async rollout, optional libraries installed."""

from __future__ import annotations

from typing import Any

from armor_core.config.packs import missing_pack
from armor_core.config.schema import ArmorConfig, ConfigError
from armor_core.interfaces import CAPABILITIES, capability, unknown_param

__all__ = ["validate_plugins"]


def _grouped_estimators(pm: Any) -> str:
    return ", ".join(sorted(n for n in pm.names("advantage_estimator") if pm.get("advantage_estimator", n).grouped))


def validate_plugins(cfg: ArmorConfig, pm: Any = None) -> dict[str, Any]:
    """Resolve every plugin name in the config; an unknown one is a ConfigError naming the key.

    Returns ``{config key: implementation}`` for what this run will use.
    """
    from armor_core.plugins import UnknownPluginError, get_plugin_manager

    pm = pm or get_plugin_manager()
    wanted = _wanted(cfg, pm)
    resolved = {}
    for key, kind, name in wanted:
        try:
            resolved[key] = pm.get(kind, name, where=key)
        except UnknownPluginError as e:
            raise ConfigError((kind == "reward_domain" and missing_pack(name, key)) or str(e)) from None
    _check_resolved(cfg, pm, resolved, wanted)
    return resolved


def _wanted(cfg: ArmorConfig, pm: Any) -> list[tuple[str, str, str]]:
    """``(config key, plugin kind, name)`` for every plugin the config names and this run will use."""
    wanted: list[tuple[str, str, str]] = [
        ("algorithm.adv_estimator", "advantage_estimator", cfg.algorithm.adv_estimator),
        ("actor.policy_loss", "policy_loss", cfg.actor.policy_loss),
        ("actor.loss_agg_mode", "loss_aggregation", cfg.actor.loss_agg_mode),
        ("rollout.backend", "rollout_backend", cfg.rollout.backend),
    ]
    if cfg.actor.use_kl_loss:
        wanted.append(("actor.kl_loss_type", "kl_estimator", cfg.actor.kl_loss_type))
    if cfg.algorithm.use_kl_in_reward:
        wanted.append(("algorithm.kl_penalty", "kl_estimator", cfg.algorithm.kl_penalty))
    if cfg.rollout.multi_turn.enable:
        wanted.append(("rollout.multi_turn.environment", "environment", cfg.rollout.multi_turn.environment))
    if not cfg.data.train_files and cfg.data.task:
        wanted.append(("data.task", "task", cfg.data.task))
    if cfg.guard.enable:
        for i, g in enumerate(cfg.guard.guards):
            wanted.append((f"guard.guards[{i}].name", "stability_guard", g["name"]))
    for i, name in enumerate(cfg.trainer.loggers):
        wanted.append((f"trainer.loggers[{i}]", "metric_tracker", name))
    installed = set(pm.names("reward_domain"))
    for source, spec in cfg.reward.domain_map.items():
        domains = [spec] if isinstance(spec, str) else list(spec)
        for d in domains:
            # another name may be a domain the reward section defines itself (reward.custom, remote, model, judge):
            # the RewardManager, which reads those, resolves it, or names the key and the nearest domain
            if d in installed or missing_pack(d, ""):
                wanted.append((f"reward.domain_map.{source}", "reward_domain", d))
    return wanted


def _check_resolved(cfg: ArmorConfig, pm: Any, resolved: dict[str, Any], wanted: list[tuple[str, str, str]]) -> None:
    """The checks that need the plugins themselves: groups, parameters, async support, optional libraries."""
    if cfg.algorithm.filter_groups and not resolved["algorithm.adv_estimator"].grouped:
        raise ConfigError(
            "algorithm.filter_groups=true drops groups whose scores agree, but "
            f"algorithm.adv_estimator={cfg.algorithm.adv_estimator!r} does not compare a prompt's samples with each "
            f"other (no groups); use one that does ({_grouped_estimators(pm)}) or set filter_groups=false"
        )
    if cfg.algorithm.adv_kwargs.get("normalize_components") and not resolved["algorithm.adv_estimator"].grouped:
        raise ConfigError(
            "algorithm.adv_kwargs.normalize_components=true normalises each reward component within a prompt's "
            f"group of samples, but algorithm.adv_estimator={cfg.algorithm.adv_estimator!r} has no groups; use one "
            f"that does ({_grouped_estimators(pm)}) or drop normalize_components"
        )
    # the same test call_with_params makes at step 1, made before Ray starts (3 and 4 arguments go by position)
    for key, fn, params, n_positional in (
        ("algorithm.adv_kwargs", resolved["algorithm.adv_estimator"].fn, cfg.algorithm.adv_kwargs, 3),
        ("actor.policy_loss_kwargs", resolved["actor.policy_loss"].fn, cfg.actor.policy_loss_kwargs, 4),
    ):
        problem = unknown_param(fn, params, n_positional, key)
        if problem:
            raise ConfigError(problem)
    if cfg.rollout.mode == "async" and not capability(
        "rollout_backend", resolved["rollout.backend"], "separate_worker"
    ):
        raise ConfigError(
            "rollout.mode=async runs the rollout backend in workers of its own, but "
            f"rollout.backend={cfg.rollout.backend!r} does not declare it can (separate_worker = True on its class: "
            "it takes new weights through update_weights, or generates from the model it was given, in a process "
            "without the actor); use rollout.mode=sync"
        )
    # a plugin whose library is an optional install (vllm, wandb, mlflow) says how to install it now, not in a worker
    for key, kind, name in wanted:
        check = capability(kind, resolved[key], "check_available") if "check_available" in CAPABILITIES[kind] else None
        if callable(check):
            try:
                check()
            except ImportError as e:
                raise ConfigError(f"{key}={name!r}: {e}") from None
