"""A plain Python function as a tool: its JSON schema from the signature and the docstring.

    def lookup(key: str, default: str | None = None) -> str:
        '''Read one value of the table.

        Args:
            key: the row's key, e.g. "alpha".
            default: returned when the key is missing.
        '''

becomes the OpenAI / Hermes function schema that chat templates render into the system prompt
(``tokenizer.apply_chat_template(messages, tools=[...])``)::

    {"type": "function", "function": {"name": "lookup", "description": "Read one value of the table.",
     "parameters": {"type": "object", "properties": {"key": {"type": "string", "description": ...},
     "default": {"type": "string", "description": ..., "nullable": true}}, "required": ["key"]}}}

Parameter types come from the annotations (``int``, ``float``, ``str``, ``bool``, ``list[X]``,
``dict``, ``Literal[...]`` as an enum, ``X | None`` as nullable); descriptions from a Google-style
``Args:`` section. Keyword-only parameters (after ``*``) are left out: the environment sets them from
the row (``extra.tools_kwargs``), the model never sees or sets them. A parameter without an
annotation, ``*args`` or ``**kwargs`` is refused: the model could not be told what to send.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Any, Callable, Literal, Union, get_args, get_origin

__all__ = ["ToolSchemaError", "tool_schema"]

_SIMPLE = {int: "integer", float: "number", str: "string", bool: "boolean", dict: "object", list: "array"}
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$")
_OTHER_SECTION = re.compile(r"^\s*(Returns?|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_PARAM_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


class ToolSchemaError(ValueError):
    """A function that cannot be described to the model as a tool."""


def _json_type(annotation: Any, where: str) -> dict[str, Any]:
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1:
            raise ToolSchemaError(f"{where}: a union of {args} has no single JSON type; use one type or X | None")
        return {**_json_type(rest[0], where), "nullable": True}
    if origin is Literal:
        kinds = {type(a) for a in args}
        if len(kinds) != 1 or next(iter(kinds)) not in _SIMPLE:
            raise ToolSchemaError(f"{where}: Literal{list(args)} must list values of one JSON type")
        return {"type": _SIMPLE[next(iter(kinds))], "enum": list(args)}
    if origin in (list, tuple, set, frozenset):
        item = args[0] if args else None
        return {"type": "array", **({"items": _json_type(item, where)} if item not in (None, Ellipsis) else {})}
    if origin is dict or annotation is dict:
        return {"type": "object"}
    if annotation in _SIMPLE:
        return {"type": _SIMPLE[annotation]}
    raise ToolSchemaError(f"{where}: type {annotation!r} has no JSON schema; use int, float, str, bool, list or dict")


def _docstring(fn: Callable) -> tuple[str, dict[str, str]]:
    """The description (the text before the first section) and each parameter's description."""
    doc = inspect.getdoc(fn) or ""
    lines = doc.splitlines()
    description, params, current, in_args = [], {}, None, False
    for line in lines:
        if _SECTION.match(line):
            in_args, current = True, None
            continue
        if _OTHER_SECTION.match(line):
            in_args, current = False, None
            continue
        if not in_args:
            if not params and line.strip():
                description.append(line.strip())
            continue
        m = _PARAM_LINE.match(line)
        if m and (not current or len(line) - len(line.lstrip()) <= params[current][1]):
            current = m.group(1)
            params[current] = (m.group(2).strip(), len(line) - len(line.lstrip()))
        elif current and line.strip():
            text, indent = params[current]
            params[current] = (f"{text} {line.strip()}".strip(), indent)
    return " ".join(description), {k: v for k, (v, _) in params.items()}


def tool_schema(fn: Callable, name: str | None = None) -> dict[str, Any]:
    """The function schema of ``fn`` (see the module docstring); ``name`` overrides ``fn.__name__``."""
    tool = name or getattr(fn, "__name__", None)
    if not tool or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}", tool):
        raise ToolSchemaError(f"tool name {tool!r}: use letters, digits, _ or -, at most 64, not starting with a digit")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # an annotation that does not resolve
        raise ToolSchemaError(f"tool {tool!r}: its annotations do not resolve ({e})") from None
    description, docs = _docstring(fn)
    properties: dict[str, Any] = {}
    required = []
    for pname, param in inspect.signature(fn).parameters.items():
        where = f"tool {tool!r}, parameter {pname!r}"
        if param.kind == param.KEYWORD_ONLY:  # set by the environment (a row's tools_kwargs), never by the model
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolSchemaError(f"{where}: *args / **kwargs cannot be described to the model; name each parameter")
        if pname not in hints:
            raise ToolSchemaError(f"{where} has no type annotation; annotate it (int, float, str, bool, list, dict)")
        properties[pname] = {
            **_json_type(hints[pname], where),
            **({"description": docs[pname]} if pname in docs else {}),
        }
        if param.default is param.empty:
            required.append(pname)
    return {
        "type": "function",
        "function": {
            "name": tool,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }
