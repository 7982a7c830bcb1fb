"""Tool-call parsers: the calls an assistant turn makes, read from its text.

``hermes`` reads the format the Qwen2.5 / Qwen3 chat templates ask for (and Hermes-style models
emit)::

    <tool_call>
    {"name": "lookup", "arguments": {"key": "alpha"}}
    </tool_call>

Several blocks in one turn are parallel calls, in order. A block whose JSON does not parse, is not
an object, lacks ``name`` or has ``arguments`` that are not an object, or cannot be read at all (nested
too deeply for the parser, or holding an integer of more digits than Python converts) becomes a ``ToolCall`` with
``error`` set (the environment answers it with an error observation rather than failing the
episode); an opening tag without its closing tag is such an error too. ``arguments`` may also be a
JSON string holding the object (some models double-encode it).

Parsing is linear in the text: each block is found with ``str.find``, never with a backtracking
pattern.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["PARSERS", "ToolCall", "parse_hermes"]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # why the call could not be read; the environment reports it to the model


_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


def _loads(text: str) -> tuple[Any, str | None]:
    """``json.loads(text)``, or why it cannot be read: invalid JSON, nested deeper than the parser's recursion
    allows, or an integer past Python's limit on digits converted (``sys.get_int_max_str_digits``)."""
    try:
        return json.loads(text), None
    except json.JSONDecodeError as e:
        return None, f"is not valid JSON ({e.msg} at character {e.pos})"
    except RecursionError:
        return None, "is nested too deeply to read (arrays or objects inside each other)"
    except ValueError:  # the one other ValueError json.loads raises: int() refused a number's digits
        return None, f"holds a number of more than {sys.get_int_max_str_digits()} digits, too long to read"


def _read_block(block: str) -> ToolCall:
    data, problem = _loads(block)
    if problem:
        return ToolCall("", error=f"the tool call {problem}")
    if not isinstance(data, dict):
        return ToolCall(
            "", error=f"the tool call must be a JSON object with name and arguments, got {type(data).__name__}"
        )
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall("", error='the tool call has no "name" string')
    args = data.get("arguments", {})
    if isinstance(args, str):  # double-encoded
        args, problem = _loads(args) if args.strip() else ({}, None)
        if problem:
            return ToolCall(name, error=f'the "arguments" string {problem}')
    if not isinstance(args, dict):
        return ToolCall(name, error=f'"arguments" must be a JSON object, got {type(args).__name__}')
    return ToolCall(name, args)


def parse_hermes(text: str) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` block of ``text``, in order (see the module docstring)."""
    calls: list[ToolCall] = []
    at = 0
    while True:
        start = text.find(_OPEN, at)
        if start < 0:
            return calls
        end = text.find(_CLOSE, start + len(_OPEN))
        if end < 0:
            calls.append(ToolCall("", error=f"a {_OPEN} without its {_CLOSE}"))
            return calls
        calls.append(_read_block(text[start + len(_OPEN) : end].strip()))
        at = end + len(_CLOSE)


PARSERS: dict[str, Callable[[str], list[ToolCall]]] = {"hermes": parse_hermes}
