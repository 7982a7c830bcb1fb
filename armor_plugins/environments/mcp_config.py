"""The ``tools`` environment's MCP servers as config, and their tools as the function schemas the model is shown.

    environment_kwargs:
      mcp_servers:
        - name: tables                       # letters, digits, _ or -; names the server in errors and metrics
          command: python                    # stdio: the server is this process (args, env, cwd optional)
          args: [/srv/tables_server.py]
          hidden: [table]                    # parameters the row sets (extra.tools_kwargs.<tool>), never the model
        - name: search
          url: http://127.0.0.1:8000/mcp     # streamable HTTP: a server already running
          headers: {Authorization: Bearer ...}
          tools: [web_search]                # allow-list; default: every tool the server lists
          timeout_s: 20                      # per call; default the environment's timeout_s
          startup_timeout_s: 30              # connect, initialize and list the tools (default 30)
          max_restarts: 3                    # a closed connection is reopened for the next call, this often

Nothing here imports ``mcp``: the config is checked, and a listed tool's ``inputSchema`` becomes the
OpenAI / Hermes function schema (``tool_spec``) without it. Hidden parameters are taken out of the
schema the model sees; a call that names one is refused like any argument the schema does not show.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

__all__ = ["McpServerSpec", "parse_servers", "tool_spec"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,63}")
_KEYS = {
    "name",
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "tools",
    "hidden",
    "timeout_s",
    "startup_timeout_s",
    "max_restarts",
}


@dataclass(frozen=True)
class McpServerSpec:
    """One MCP server: stdio (``command``) or streamable HTTP (``url``); see the module docstring."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    tools: tuple[str, ...] | None = None
    hidden: tuple[str, ...] = ()
    timeout_s: float = 10.0
    startup_timeout_s: float = 30.0
    max_restarts: int = 3

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "streamable_http"


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where} must be a list of strings, got {value!r}")
    return tuple(value)


def _string_map(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{where} must be a mapping of name -> text, got {value!r}")
    return tuple((k, str(v)) for k, v in value.items())


def _seconds(value: Any, where: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
        raise ValueError(f"{where}={value!r} must be a finite number of seconds > 0")
    return float(value)


def _one(raw: Any, where: str, default_timeout_s: float) -> McpServerSpec:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be a mapping with a name and a command or url, got {raw!r}")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; keys: {', '.join(sorted(_KEYS))}")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"{where}.name={name!r}: give a name of letters, digits, _ or - (at most 64)")
    where = f"{where} ({name!r})"
    command, url = raw.get("command"), raw.get("url")
    if (command is None) == (url is None):
        raise ValueError(f"{where}: give either command (a stdio server) or url (streamable HTTP), not both or neither")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise ValueError(f"{where}.command={command!r} must be the server's executable, e.g. 'python'")
    if url is not None and (not isinstance(url, str) or not re.match(r"https?://", url)):
        raise ValueError(
            f"{where}.url={url!r} must be an http:// or https:// address, e.g. 'http://127.0.0.1:8000/mcp'"
        )
    stdio_only = [k for k in ("args", "env", "cwd") if url is not None and k in raw]
    http_only = [k for k in ("headers",) if command is not None and k in raw]
    if stdio_only or http_only:
        raise ValueError(
            f"{where}: {', '.join(stdio_only + http_only)} do not apply to a {'url' if url else 'command'}"
        )
    cwd = raw.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ValueError(f"{where}.cwd={cwd!r} must be a directory path")
    restarts = raw.get("max_restarts", 3)
    if not isinstance(restarts, int) or isinstance(restarts, bool) or restarts < 0:
        raise ValueError(f"{where}.max_restarts={restarts!r} must be an integer >= 0")
    return McpServerSpec(
        name=name,
        command=command,
        args=_strings(raw.get("args", ()), f"{where}.args"),
        env=_string_map(raw["env"], f"{where}.env") if raw.get("env") is not None else None,
        cwd=cwd,
        url=url,
        headers=_string_map(raw.get("headers") or {}, f"{where}.headers"),
        tools=_strings(raw["tools"], f"{where}.tools") if raw.get("tools") is not None else None,
        hidden=_strings(raw.get("hidden", ()), f"{where}.hidden"),
        timeout_s=_seconds(raw.get("timeout_s", default_timeout_s), f"{where}.timeout_s"),
        startup_timeout_s=_seconds(raw.get("startup_timeout_s", 30.0), f"{where}.startup_timeout_s"),
        max_restarts=restarts,
    )


def parse_servers(raw: Any, default_timeout_s: float = 10.0) -> tuple[McpServerSpec, ...]:
    """``environment_kwargs.mcp_servers`` checked: a ``ValueError`` names the entry, the key and what is right."""
    if raw is None:
        return ()
    if isinstance(raw, (str, bytes, Mapping)) or not isinstance(raw, Sequence):
        raise ValueError(f"mcp_servers must be a list of servers ({{name, command | url, ...}}), got {raw!r}")
    specs = tuple(_one(r, f"mcp_servers[{i}]", default_timeout_s) for i, r in enumerate(raw))
    names = [s.name for s in specs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"mcp_servers: the name(s) {', '.join(map(repr, twice))} are given to more than one server")
    return specs


def tool_spec(server: McpServerSpec, name: str, description: str | None, input_schema: Any) -> dict[str, Any]:
    """The function schema the model is shown for the tool ``name`` that ``server`` listed: its JSON schema
    without the server's ``hidden`` parameters and without pydantic's ``title`` noise."""
    where = f"MCP server {server.name!r}, tool {name!r}"
    if not _NAME.fullmatch(name):
        raise ValueError(f"{where}: a tool name must be letters, digits, _ or -, at most 64")
    schema = dict(input_schema) if isinstance(input_schema, Mapping) else {}
    if schema.get("type", "object") != "object":
        raise ValueError(f"{where}: its inputSchema is of type {schema.get('type')!r}; a tool takes an object")
    properties = {
        k: {key: v for key, v in p.items() if key != "title"} if isinstance(p, Mapping) else p
        for k, p in (schema.get("properties") or {}).items()
        if k not in server.hidden
    }
    required = [k for k in schema.get("required") or [] if k not in server.hidden]
    parameters = {k: v for k, v in schema.items() if k not in ("title", "properties", "required")}
    parameters.update({"type": "object", "properties": properties, "required": required})
    return {"type": "function", "function": {"name": name, "description": description or "", "parameters": parameters}}
