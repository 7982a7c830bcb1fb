"""Field-level checks of the config's dataclasses, from each field's metadata (see ``config.f``).

Ranges (``ge``, ``gt``, ``le``, ``lt``) and ``choices``; a float field must be finite (NaN fails
every comparison, so it would pass any range); a list field may declare its ``length``, its items'
type (``item``: ``float`` takes ints too, never bools; ``str``) and a range for every item
(``item_range``); NaN anywhere inside a list or dict (plugins' keyword arguments) is refused, inf
there is left to the plugin (it may mean "no limit").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

__all__ = ["first_problem"]


def first_problem(cfg: Any, cls: type, prefix: str = "") -> str | None:
    """The first field of ``cfg`` (an instance of the dataclass ``cls``) whose value breaks its
    checks, as a message naming the key, the value and what is allowed; None if all pass."""
    for fld in dataclasses.fields(cls):
        key = f"{prefix}{fld.name}"
        value = getattr(cfg, fld.name)
        if fld.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(fld.default_factory):
            problem = first_problem(value, fld.default_factory, key + ".")
            if problem:
                return problem
            continue
        m = fld.metadata
        if value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            # every comparison with NaN is false: it would pass each range check below
            return f"{key}={value!r} is not a finite number ({m.get('help', '')})"
        if isinstance(value, (dict, list)):
            problem = (_list_problem(key, value, m) if isinstance(value, list) else None) or _nan_in(value, key)
            if problem:
                return problem
            continue
        bad = _out_of_range(value, m)
        if bad:
            return f"{key}={value!r} is out of range: must be {bad} ({m.get('help', '')})"
    return None


def _out_of_range(value: Any, m: Mapping[str, Any]) -> str | None:
    """What ``value`` must be instead, or None if it satisfies the checks in ``m``."""
    if "choices" in m and value not in m["choices"]:
        return f"one of {m['choices']}"
    if "ge" in m and value < m["ge"]:
        return f">= {m['ge']}"
    if "gt" in m and value <= m["gt"]:
        return f"> {m['gt']}"
    if "le" in m and value > m["le"]:
        return f"<= {m['le']}"
    if "lt" in m and value >= m["lt"]:
        return f"< {m['lt']}"
    return None


def _list_problem(key: str, value: list, m: Mapping[str, Any]) -> str | None:
    if "length" in m and len(value) != m["length"]:
        return f"{key}={value!r} has {len(value)} item(s); it takes exactly {m['length']} ({m.get('help', '')})"
    want = m.get("item")
    for i, item in enumerate(value):
        number = isinstance(item, (int, float)) and not isinstance(item, bool)
        if (want is float and not number) or (want is str and not isinstance(item, str)):
            takes = "numbers" if want is float else "text"
            return f"{key}[{i}]={item!r} is a {type(item).__name__}; {key} takes {takes} ({m.get('help', '')})"
        if want is float and not math.isfinite(float(item)):
            return f"{key}[{i}]={item!r} is not a finite number ({m.get('help', '')})"
        bad = _out_of_range(item, m.get("item_range", {}))
        if bad:
            return f"{key}[{i}]={item!r} is out of range: must be {bad} ({m.get('help', '')})"
    return None


def _nan_in(value: Any, key: str) -> str | None:
    """NaN anywhere in a free-form list or dict (keyword arguments of plugins) is a mistake; inf
    may mean 'no limit' to a plugin and is left to it."""
    if isinstance(value, float) and math.isnan(value):
        return f"{key}=nan is not a number"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        problem = _nan_in(v, f"{key}.{k}" if isinstance(value, dict) else f"{key}[{k}]")
        if problem:
            return problem
    return None
