"""The plugin manager: finds plugins through entry points and owns the catalog of what they provide.

Every implementation, built-in or third-party, arrives the same way: a module named by an entry
point in group ``armor`` implements one or more ``armor_register_*`` hooks (see ``hookspecs.py``).
The catalog is built by calling each plugin's hooks one plugin at a time, so every registered name
is tied to the plugin and distribution that provided it; that is what lets a duplicate name be an
error naming both providers, and ``armor plugins`` show where each implementation comes from.

A plugin manager is never sent between processes: each Ray worker builds its own
(``get_plugin_manager()``), which sees the same installed distributions.

Long module: ``get_plugin`` and ``PluginManager.get`` carry one typed overload per plugin kind, so a lookup
returns the kind's own type to a type checker.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import inspect
import os
import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Literal, overload

import pluggy

from armor_core import hookspecs
from armor_core.interfaces import KINDS, ground_truth_check_problem

if TYPE_CHECKING:
    from armor_core.interfaces import (
        AdvantageEstimator,
        Environment,
        KLEstimator,
        LossAggregation,
        MetricTracker,
        PolicyLoss,
        RewardDomain,
        RolloutBackend,
        StabilityGuard,
        Task,
    )

    #: what an ``environment`` registers: a class following ``Environment``, or a factory building one
    EnvironmentFactory = type[Environment] | Callable[..., Environment]

__all__ = [
    "DISABLE_ENV",
    "DuplicatePluginError",
    "PluginEntry",
    "PluginError",
    "PluginManager",
    "UnknownPluginError",
    "get_plugin",
    "get_plugin_manager",
    "list_plugins",
    "reset_plugin_manager",
]

ENTRY_POINT_GROUP = "armor"
DISABLE_ENV = "ARMOR_DISABLE_PLUGINS"
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.+\-]*$")


class PluginError(Exception):
    """Something is wrong with an installed or registered plugin."""


class DuplicatePluginError(PluginError):
    pass


class UnknownPluginError(PluginError, KeyError):
    """A name was asked for that no plugin provides. ``str()`` gives the full message."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


@dataclass(frozen=True)
class PluginEntry:
    kind: str
    name: str
    obj: Any
    plugin: str
    distribution: str
    version: str


def _parse_disabled(value: str | None) -> set[str]:
    return {n.strip() for n in (value or "").split(",") if n.strip()}


class _ArmorPluggyManager(pluggy.PluginManager):
    """Treats any ``armor_*`` function on a plugin as a hook implementation, marked or not.

    pytest does the same for ``pytest_*``. Without it a plugin author who forgets ``@hookimpl``
    and misspells the hook name gets silence; with it ``check_pending`` names the function.
    """

    def parse_hookimpl_opts(self, plugin: Any, name: str):  # type: ignore[override]
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith("armor_") and inspect.isroutine(getattr(plugin, name, None)):
            opts = {}
        return opts


class PluginManager:
    """Loads plugins and answers ``get(kind, name)``.

    :param load_entrypoints: load every installed plugin of group ``armor`` (False gives an empty
        manager, for tests that register their own plugins only).
    :param disabled: what to block; defaults to ``$ARMOR_DISABLE_PLUGINS`` (comma-separated): a
        plugin (entry-point) name blocks everything it registers, ``kind:name`` (e.g.
        ``stability_guard:kl``, ``kl_estimator:k3``) one implementation.
    """

    def __init__(self, *, load_entrypoints: bool = True, disabled: Iterable[str] | None = None) -> None:
        self._pm = _ArmorPluggyManager(hookspecs.PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self.disabled = set(disabled) if disabled is not None else _parse_disabled(os.environ.get(DISABLE_ENV))
        # "kind:name" blocks one implementation; a bare name blocks a whole plugin (entry point)
        self.disabled_entries = {tuple(d.split(":", 1)) for d in self.disabled if ":" in d}
        for kind, _ in self.disabled_entries:
            if kind not in KINDS:
                raise PluginError(
                    f"{DISABLE_ENV}: {kind!r} in '{kind}:...' is not a plugin kind; kinds are {', '.join(KINDS)}"
                )
        for name in self.disabled:
            if ":" not in name:
                self._pm.set_blocked(name)
        self._lock = threading.RLock()
        self._catalog: dict[str, dict[str, PluginEntry]] | None = None
        self._dists: dict[str, tuple[str, str]] = {}
        if load_entrypoints:
            self._load_entrypoints()
        self.check()

    def _load_entrypoints(self) -> None:
        seen: set[str] = set()
        for dist in importlib.metadata.distributions():
            for ep in dist.entry_points:
                if ep.group != ENTRY_POINT_GROUP or ep.name in seen:
                    continue  # a distribution found twice on sys.path is loaded once
                seen.add(ep.name)
                dist_name = dist.metadata["Name"]
                if self._pm.is_blocked(ep.name):
                    continue
                if self._pm.get_plugin(ep.name) is not None:
                    other = self._dists.get(ep.name, ("?", "?"))[0]
                    raise DuplicatePluginError(
                        f"two plugins are named {ep.name!r}: from {other} and from {dist_name}; block one with "
                        f"{DISABLE_ENV}={ep.name}"
                    )
                try:
                    plugin = ep.load()
                except Exception as e:  # an installed plugin that fails to import must say which one
                    raise PluginError(
                        f"plugin {ep.name!r} ({ep.value}) from distribution {dist_name} {dist.version} failed to "
                        f"import: {type(e).__name__}: {e}. Fix or uninstall it, or block it with "
                        f"{DISABLE_ENV}={ep.name}"
                    ) from e
                self._pm.register(plugin, name=ep.name)
                self._dists[ep.name] = (dist_name, dist.version)
        unknown = sorted(d for d in self.disabled if ":" not in d and d not in seen)
        if unknown:
            raise PluginError(
                f"{DISABLE_ENV}: {', '.join(map(repr, unknown))} is no installed plugin (entry point of group "
                f"{ENTRY_POINT_GROUP!r}); installed: {', '.join(sorted(seen))}. To block one implementation write "
                "kind:name, e.g. stability_guard:kl"
            )

    # -- registration -------------------------------------------------------------------------

    def register(self, plugin: Any, name: str | None = None) -> str:
        """Register a plugin object (module, class instance, ...) and return its name."""
        with self._lock:
            registered = self._pm.register(plugin, name=name)
            if registered is None:  # blocked
                return name or self._pm.get_canonical_name(plugin)
            self._catalog = None
            self.check()
            return registered

    def unregister(self, plugin: Any = None, name: str | None = None) -> None:
        with self._lock:
            self._pm.unregister(plugin=plugin, name=name)
            self._catalog = None

    def check(self) -> None:
        """Fail on an ``armor_*`` function that matches no hook: a misspelled hook never runs silently."""
        try:
            self._pm.check_pending()
        except pluggy.PluginValidationError as e:
            known = [n for n in dir(hookspecs) if n.startswith("armor_register_")]
            bad = getattr(e, "plugin", None)
            hint = ""
            for impl_name in [n for n in dir(bad) if n.startswith("armor_")] if bad is not None else []:
                if impl_name not in known:
                    close = difflib.get_close_matches(impl_name, known, n=1)
                    hint = f"; did you mean {close[0]!r}?" if close else ""
                    break
            raise PluginError(f"{e}{hint} Known hooks: {', '.join(known)}") from e

    # -- catalog ------------------------------------------------------------------------------

    def _distribution_of(self, plugin_name: str, plugin: Any) -> tuple[str, str]:
        if plugin_name in self._dists:
            return self._dists[plugin_name]
        module = getattr(plugin, "__name__", None) if inspect.ismodule(plugin) else type(plugin).__module__
        top = (module or "").split(".")[0]
        dists = importlib.metadata.packages_distributions().get(top, [])
        if dists:
            return dists[0], importlib.metadata.version(dists[0])
        return "(registered in-process)", "-"

    def _build_catalog(self) -> dict[str, dict[str, PluginEntry]]:
        catalog: dict[str, dict[str, PluginEntry]] = {kind: {} for kind in KINDS}
        for kind, (hook_name, wrapper) in KINDS.items():
            hook = getattr(self._pm.hook, hook_name)
            for impl in hook.get_hookimpls():  # registration order: the first provider is named first
                plugin_name = impl.plugin_name
                dist, version = self._distribution_of(plugin_name, impl.plugin)

                def register(
                    name: str, obj: Any, *, _kind=kind, _plugin=plugin_name, _dist=dist, _ver=version, _wrap=wrapper
                ) -> None:
                    if not isinstance(name, str) or not _NAME_RE.match(name):
                        raise PluginError(
                            f"plugin {_plugin!r} ({_dist}) registered {_kind} {name!r}: names are lowercase, e.g. "
                            "'my_estimator'"
                        )
                    _check_kind(obj, _kind, name, f"plugin {_plugin!r} ({_dist})", _wrap)
                    if _wrap is not None and not isinstance(obj, _wrap):
                        if not callable(obj):
                            raise PluginError(
                                f"plugin {_plugin!r} ({_dist}) registered {_kind} {name!r} as {type(obj).__name__}; "
                                f"expected a function or {_wrap.__name__}"
                            )
                        obj = _wrap(fn=obj, description=(inspect.getdoc(obj) or "").split("\n")[0])
                    if _wrap is None and not callable(obj):
                        raise PluginError(
                            f"plugin {_plugin!r} ({_dist}) registered {_kind} {name!r} as {type(obj).__name__}; "
                            "expected a class"
                        )
                    if (_kind, name) in self.disabled_entries:
                        return
                    problem = ground_truth_check_problem(getattr(obj, "validate_ground_truth", None))
                    if _kind == "reward_domain" and problem:
                        raise PluginError(
                            f"plugin {_plugin!r} ({_dist}) registered reward_domain {name!r}: {problem}. Fix it, or "
                            f"block it with {DISABLE_ENV}={_plugin} (or reward_domain:{name})"
                        )
                    existing = catalog[_kind].get(name)
                    if existing is not None:
                        raise DuplicatePluginError(
                            f"{_kind} {name!r} is registered twice: by plugin {existing.plugin!r} "
                            f"({existing.distribution} {existing.version}) and by plugin {_plugin!r} ({_dist} "
                            f"{_ver}). Uninstall one, or block one plugin with {DISABLE_ENV}={_plugin}"
                        )
                    catalog[_kind][name] = PluginEntry(_kind, name, obj, _plugin, _dist, _ver)

                impl.function(register=register)
        return catalog

    @property
    def catalog(self) -> dict[str, dict[str, PluginEntry]]:
        with self._lock:
            if self._catalog is None:
                self._catalog = self._build_catalog()
            return self._catalog

    def entries(self, kind: str | None = None) -> Iterator[PluginEntry]:
        kinds = [kind] if kind is not None else list(KINDS)
        for k in kinds:
            self._check_kind(k)
            yield from sorted(self.catalog[k].values(), key=lambda e: e.name)

    def names(self, kind: str) -> list[str]:
        self._check_kind(kind)
        return sorted(self.catalog[kind])

    def entry(self, kind: str, name: str, *, where: str | None = None) -> PluginEntry:
        self._check_kind(kind)
        found = self.catalog[kind].get(name)
        if found is None:
            raise UnknownPluginError(unknown_name_message(kind, name, self.names(kind), where=where))
        return found

    @overload
    def get(
        self, kind: Literal["advantage_estimator"], name: str, *, where: str | None = None
    ) -> AdvantageEstimator: ...
    @overload
    def get(self, kind: Literal["policy_loss"], name: str, *, where: str | None = None) -> PolicyLoss: ...
    @overload
    def get(self, kind: Literal["kl_estimator"], name: str, *, where: str | None = None) -> KLEstimator: ...
    @overload
    def get(self, kind: Literal["loss_aggregation"], name: str, *, where: str | None = None) -> LossAggregation: ...
    @overload
    def get(self, kind: Literal["reward_domain"], name: str, *, where: str | None = None) -> RewardDomain: ...
    @overload
    def get(self, kind: Literal["task"], name: str, *, where: str | None = None) -> Task: ...
    @overload
    def get(self, kind: Literal["stability_guard"], name: str, *, where: str | None = None) -> type[StabilityGuard]: ...
    @overload
    def get(self, kind: Literal["rollout_backend"], name: str, *, where: str | None = None) -> type[RolloutBackend]: ...
    @overload
    def get(self, kind: Literal["metric_tracker"], name: str, *, where: str | None = None) -> type[MetricTracker]: ...
    @overload
    def get(self, kind: Literal["environment"], name: str, *, where: str | None = None) -> EnvironmentFactory: ...
    @overload
    def get(self, kind: str, name: str, *, where: str | None = None) -> Any: ...
    def get(self, kind: str, name: str, *, where: str | None = None) -> Any:
        """The implementation registered as ``name`` for ``kind`` (wrapped in its interface type); typed per kind."""
        return self.entry(kind, name, where=where).obj

    @staticmethod
    def _check_kind(kind: str) -> None:
        if kind not in KINDS:
            close = difflib.get_close_matches(kind, KINDS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown plugin kind {kind!r}.{hint} Kinds: {', '.join(KINDS)}")


def _check_kind(obj: Any, kind: str, name: str, who: str, wrapper: type | None) -> None:
    """Refuse an implementation of another kind: a class where a function kind is registered (a guard registered
    as an estimator), or another kind's wrapper (a ``PolicyLoss`` registered as an estimator or as a guard)."""
    wrappers = tuple(w for _, w in KINDS.values() if w is not None)
    if isinstance(obj, wrappers) and not (wrapper is not None and isinstance(obj, wrapper)):
        expected = wrapper.__name__ if wrapper is not None else "a class"
        raise PluginError(f"{who} registered {kind} {name!r} as a {type(obj).__name__}; expected {expected}")
    if wrapper is not None and isinstance(obj, type):
        raise PluginError(
            f"{who} registered {kind} {name!r} as the class {obj.__name__}; expected a function or {wrapper.__name__} "
            "(classes are registered by the class kinds: stability guards, rollout backends, metric trackers)"
        )


def unknown_name_message(kind: str, name: str, available: list[str], *, where: str | None = None) -> str:
    at = f" (config key {where})" if where else ""
    close = difflib.get_close_matches(str(name), available, n=1, cutoff=0.5)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    listing = ", ".join(available) if available else "none are installed"
    return f"unknown {kind} {name!r}{at}.{hint} Available: {listing}"


_default: PluginManager | None = None
_default_lock = threading.Lock()


def get_plugin_manager() -> PluginManager:
    """The process-wide plugin manager, built on first use from installed entry points."""
    global _default
    with _default_lock:
        if _default is None:
            _default = PluginManager()
        return _default


def reset_plugin_manager() -> None:
    """Forget the process-wide manager (the next call rebuilds it, e.g. after a pip install)."""
    global _default
    with _default_lock:
        _default = None


@overload
def get_plugin(kind: Literal["advantage_estimator"], name: str) -> AdvantageEstimator: ...
@overload
def get_plugin(kind: Literal["policy_loss"], name: str) -> PolicyLoss: ...
@overload
def get_plugin(kind: Literal["kl_estimator"], name: str) -> KLEstimator: ...
@overload
def get_plugin(kind: Literal["loss_aggregation"], name: str) -> LossAggregation: ...
@overload
def get_plugin(kind: Literal["reward_domain"], name: str) -> RewardDomain: ...
@overload
def get_plugin(kind: Literal["task"], name: str) -> Task: ...
@overload
def get_plugin(kind: Literal["stability_guard"], name: str) -> type[StabilityGuard]: ...
@overload
def get_plugin(kind: Literal["rollout_backend"], name: str) -> type[RolloutBackend]: ...
@overload
def get_plugin(kind: Literal["metric_tracker"], name: str) -> type[MetricTracker]: ...
@overload
def get_plugin(kind: Literal["environment"], name: str) -> EnvironmentFactory: ...
@overload
def get_plugin(kind: str, name: str) -> Any: ...
def get_plugin(kind: str, name: str) -> Any:
    """Return the implementation registered under ``name`` for ``kind``.

    For notebooks, tests and tools that call a plugin directly; the same lookup the config uses,
    with the same errors. ``kind`` is one of ``advantage_estimator``, ``policy_loss``,
    ``kl_estimator``, ``loss_aggregation``, ``reward_domain``, ``stability_guard``,
    ``rollout_backend``, ``task``, ``metric_tracker``, ``environment``; the result is typed per kind
    (``get_plugin("policy_loss", ...)`` is a ``PolicyLoss``, a guard's is its class).

    >>> grpo = get_plugin("advantage_estimator", "grpo")            # doctest: +SKIP
    >>> adv, ret = grpo.fn(rewards, mask, index)                     # doctest: +SKIP

    :raises UnknownPluginError: no plugin provides ``name``; the message lists what exists and the
        nearest match.
    """
    return get_plugin_manager().get(kind, name)


def list_plugins(kind: str | None = None) -> list[PluginEntry]:
    """Every registered implementation (of one kind, or all), with its plugin and distribution."""
    return list(get_plugin_manager().entries(kind))
