"""The config entries of ``reward.remote``, ``reward.model`` and ``reward.judge``, read one way: a mapping or
a list of them, known keys only, numbers in range, a free domain name, and the data sources it scores.
Every problem is a ``ConfigError`` naming the entry (``reward.model``, or ``reward.model[1]`` in a list)
and the key."""

from __future__ import annotations

import math
from typing import Any, Iterator, Mapping, Sequence

from armor_core.config.schema import ConfigError
from armor_core.interfaces import RewardDomain

__all__ = ["Entries"]


class Entries:
    """The entries of one config key and the domains they add, in order.

    :param defaults: every key an entry may set besides ``required``, with its default.
    :param known: domain names already taken (installed, or added by other keys).
    """

    def __init__(self, value: Any, where: str, defaults: Mapping[str, Any], required: Sequence[str],
                 known: Sequence[str]) -> None:  # fmt: skip
        self.where, self.defaults, self.required, self.known = where, defaults, tuple(required), set(known)
        if not value:
            value = []
        elif isinstance(value, Mapping):
            value = [value]
        elif isinstance(value, str) or not isinstance(value, Sequence):
            raise ConfigError(f"{where}: expected a mapping {{{', '.join(self.required)}, ...}} or a list of them")
        self.values = list(value)
        self.domains: dict[str, RewardDomain] = {}
        self.routes: dict[str, str] = {}

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(where, entry)`` with the defaults filled in, each checked for its keys."""
        for i, raw in enumerate(self.values):
            at = f"{self.where}[{i}]" if len(self.values) > 1 else self.where
            if not isinstance(raw, Mapping):
                raise ConfigError(f"{at}: expected a mapping with {', '.join(self.required)}, got {raw!r}")
            unknown = sorted(set(map(str, raw)) - {*self.required, *self.defaults})
            if unknown:
                takes = ", ".join([*self.required, *self.defaults])
                raise ConfigError(f"{at}: unknown key(s) {', '.join(unknown)}; an entry takes {takes}")
            missing = [key for key in self.required if key not in raw]
            if missing:
                raise ConfigError(f"{at}: needs {', '.join(repr(k) for k in missing)}; got {dict(raw)!r}")
            yield at, {**self.defaults, **raw}

    @staticmethod
    def whole(entry: Mapping[str, Any], at: str, keys: Sequence[str], least: int = 1) -> None:
        for key in keys:
            if isinstance(entry[key], bool) or not isinstance(entry[key], int) or entry[key] < least:
                raise ConfigError(f"{at}.{key}={entry[key]!r}: expected a whole number of at least {least}")

    @staticmethod
    def seconds(entry: Mapping[str, Any], at: str, keys: Sequence[str], *, zero: bool = False) -> None:
        for key in keys:
            value = entry[key]
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or value < 0 or (value == 0 and not zero):
                raise ConfigError(f"{at}.{key}={value!r}: expected a positive number of seconds")

    def add(self, at: str, entry: Mapping[str, Any], domain: RewardDomain) -> None:
        """Add ``domain`` under ``entry["domain"]`` and route ``entry["data_sources"]`` to it."""
        name = str(entry["domain"])
        if name in self.known or name in self.domains:
            raise ConfigError(f"{at}: the domain name {name!r} is taken; name this one with {at}.domain=NAME")
        sources = entry["data_sources"]
        if isinstance(sources, str) or not isinstance(sources, Sequence):
            raise ConfigError(f"{at}.data_sources: expected a list of data_source names, got {sources!r}")
        for source in sources:
            if source in self.routes:
                raise ConfigError(f"{at}.data_sources: {source!r} is already scored by {self.routes[source]!r}")
            self.routes[str(source)] = name
        self.domains[name] = domain
