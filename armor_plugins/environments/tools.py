"""The built-in ``tools`` environment: plain Python functions as tools, called by the policy.

    rollout:
      multi_turn:
        enable: true
        environment: tools
        environment_kwargs:
          tools: [my_pkg.tools:lookup, my_pkg.tools:calculator]   # module:function, importable in workers
          parser: hermes            # how calls are read from a turn (armor_plugins.environments.parsers)
          timeout_s: 10             # per call
          mcp_servers: [...]        # tools from MCP servers too (armor_plugins.environments.mcp_config)

Each turn's text is parsed for tool calls (Hermes / Qwen ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`` blocks). A turn without a call ends the episode: it is the final answer. Calls
of one turn run concurrently (parallel calls), at most ``max_tool_calls_per_turn``; each result goes
back as a ``{"role": "tool", "content": ...}`` message, rendered by the tokenizer's chat template.
Whatever goes wrong becomes an error message the policy reads, never a crash: a malformed call, an
unknown tool, arguments the function does not take, a tool that raises (``SystemExit`` too: argparse
on bad arguments), one that runs past ``timeout_s``, a result that is not text or JSON. Every call,
sync or async, runs on a daemon thread of its own (``armor_core.ops.calls.in_thread``; an async tool on
an event loop of that thread's), so a tool that blocks or never returns costs its own call
``timeout_s`` and nothing else: it holds no shared pool's thread, and neither the rollout's event
loop nor the worker's exit waits for it. Its thread runs on until the tool returns (Python cannot
kill a thread), so a tool that may hang holding memory or a child process should run its work in a
process of its own.

Per-row arguments the policy must not see or set (a row's table, its sandbox id) are a tool's
keyword-only parameters (after ``*``): they are not in its schema, a call that names one is refused,
and the row's ``extra.tools_kwargs.<tool>`` gives them.

Tools can also come from MCP servers (``mcp_servers``: stdio or streamable HTTP, see
``mcp_config`` for the keys and ``mcp_tools`` for how they are run): listed through the protocol when
the config is checked, shown to the model beside the functions (a name both offer is refused), and
called per tool call with the row's ``extra.tools_kwargs.<tool>`` merged in, like a function's hidden
arguments (the server's ``hidden`` parameters are left out of the schema the model sees). A call past
the server's ``timeout_s``, a server that exited or went away, an MCP error and an ``isError`` result
are failed calls like a function's.

Metrics per episode: ``tool_calls``, ``tool_errors``, ``tool_seconds``.
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
import inspect
import json
import math
import time
from typing import Any, Callable, Mapping, Sequence

from armor_core import hookimpl
from armor_core.hookspecs import RegisterEnvironment
from armor_core.interfaces import AssistantTurn, EnvironmentStep
from armor_core.ops.calls import describe, in_thread
from armor_plugins.environments.mcp_config import McpServerSpec, parse_servers
from armor_plugins.environments.parsers import PARSERS, ToolCall
from armor_plugins.environments.schema import tool_schema

__all__ = ["ToolsEnvironment", "load_tool"]

_MAX_RESULT_CHARS = 20_000  # the observation limit cuts tokens later; this only bounds the work before it


def load_tool(spec: str | Callable) -> Callable:
    """A tool from ``"module:function"`` (or a callable, returned as it is)."""
    if callable(spec):
        return spec
    module_name, _, name = str(spec).partition(":")
    if not module_name or not name:
        raise ValueError(f"tool {spec!r}: write it as 'module:function', e.g. 'my_pkg.tools:lookup'")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # not found, or its import failed
        raise ValueError(f"tool {spec!r}: cannot import it ({type(e).__name__}: {e})") from None
    fn = getattr(module, name, None)
    if fn is None:
        functions = [k for k, v in vars(module).items() if callable(v) and not k.startswith("_")]
        close = difflib.get_close_matches(name, functions, n=1, cutoff=0.6)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"tool {spec!r}: cannot import it (module {module_name!r} has no {name!r}).{hint}")
    if not callable(fn):
        raise ValueError(f"tool {spec!r} is a {type(fn).__name__}, not a function")
    return fn


def _as_text(result: Any) -> str:
    if isinstance(result, str):
        text = result
    else:
        try:
            text = json.dumps(result, ensure_ascii=False)
        except (TypeError, ValueError, RecursionError) as e:  # not JSON; nested too deeply; an int of too many digits
            raise TypeError(
                f"the tool returned a {type(result).__name__}, which is neither text nor JSON ({type(e).__name__})"
            ) from None
    return text if len(text) <= _MAX_RESULT_CHARS else text[:_MAX_RESULT_CHARS]


class ToolsEnvironment:
    """Environment ``tools`` (see the module docstring): ``ToolsEnvironment(row, seed=..., tools=[...])``."""

    def __init__(
        self,
        row: Mapping[str, Any],
        *,
        seed: int = 0,
        tools: Sequence[str | Callable] = (),
        parser: str = "hermes",
        timeout_s: float = 10.0,
        max_tool_calls_per_turn: int = 4,
        mcp_servers: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.schemas = _check_local(tools, parser, timeout_s, max_tool_calls_per_turn, mcp_servers)
        self.servers = parse_servers(mcp_servers, timeout_s)  # connected on first call (mcp_tools.hub)
        self.functions = {f.__name__: f for f in map(load_tool, tools)}
        self.parse = PARSERS[parser]
        self.timeout_s = float(timeout_s)
        self.max_calls = int(max_tool_calls_per_turn)
        extra = row.get("extra") or {}
        self.hidden = dict(extra.get("tools_kwargs") or {}) if isinstance(extra, Mapping) else {}

    @staticmethod
    def check_params(
        *,
        tools: Sequence[str | Callable] = (),
        parser: str = "hermes",
        timeout_s: float = 10.0,
        max_tool_calls_per_turn: int = 4,
        mcp_servers: Sequence[Mapping[str, Any]] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Each tool's schema by name; a ``ValueError`` naming what is wrong (a tool that does not import, with the
        nearest name; an unknown parser; a limit out of range; an MCP server that is misconfigured, does not
        start, or offers a tool of a name already taken). Run in the driver before any worker starts."""
        schemas = _check_local(tools, parser, timeout_s, max_tool_calls_per_turn, mcp_servers)
        return {**schemas, **_mcp_schemas(parse_servers(mcp_servers, timeout_s), schemas)}

    @staticmethod
    def prompt_kwargs(
        tools: Sequence[str | Callable] = (),
        mcp_servers: Sequence[Mapping[str, Any]] | None = None,
        timeout_s: float = 10.0,
        **_: Any,
    ) -> dict[str, Any]:
        """``{"tools": [schema, ...]}``: the chat template renders the tools into the prompt."""
        schemas = {f.__name__: tool_schema(f) for f in map(load_tool, tools)}
        return {"tools": list({**schemas, **_mcp_schemas(parse_servers(mcp_servers, timeout_s), schemas)}.values())}

    def reset(self) -> None:
        return None

    async def step(self, turn: AssistantTurn) -> EnvironmentStep:
        calls = self.parse(turn.text)
        if not calls:  # no call: the turn is the final answer
            return EnvironmentStep(done=True)
        started = time.perf_counter()
        kept, dropped = calls[: self.max_calls], calls[self.max_calls :]
        results = await asyncio.gather(*(self._call(c) for c in kept))
        messages = [{"role": "tool", "content": text} for text, _ in results]
        messages += [
            {"role": "tool", "content": f"error: at most {self.max_calls} tool calls per turn; this one was not run"}
            for _ in dropped
        ]
        errors = sum(failed for _, failed in results) + len(dropped)
        metrics = {"tool_calls": float(len(calls)), "tool_errors": float(errors)}
        metrics["tool_seconds"] = time.perf_counter() - started
        return EnvironmentStep(observation=messages, metrics=metrics)

    async def _call(self, call: ToolCall) -> tuple[str, bool]:
        """The result text of one call and whether it failed."""
        if call.error:
            return f"error: {call.error}", True
        fn = self.functions.get(call.name)
        if fn is None and self.servers:
            return await self._call_mcp(call)
        if fn is None:
            return f"error: unknown tool {call.name!r}; tools: {', '.join(sorted(self.functions))}", True
        shown = self.schemas[call.name]["function"]["parameters"]["properties"]
        unexpected = sorted(set(call.arguments) - set(shown))
        if unexpected:
            return (
                f"error: {call.name} takes no argument {', '.join(map(repr, unexpected))}; it takes {sorted(shown)}",
                True,
            )
        args = {**call.arguments, **(self.hidden.get(call.name) or {})}
        try:
            inspect.signature(fn).bind(**args)
        except TypeError as e:
            return f"error: {call.name}: {e}", True
        try:  # every call, sync or async, on a daemon thread of its own: bounded whatever the tool does
            outcome = await asyncio.wait_for(in_thread(fn, **args), self.timeout_s)
        except asyncio.TimeoutError:
            return f"error: {call.name} did not answer within {self.timeout_s:g} s", True
        if outcome.error is not None:  # a tool's own failure, sys.exit included, is the policy's observation
            return f"error: {call.name} raised {describe(outcome.error)}", True
        try:
            return _as_text(outcome.value), False
        except TypeError as e:
            return f"error: {call.name}: {e}", True

    async def _call_mcp(self, call: ToolCall) -> tuple[str, bool]:
        """A call of a tool no function offers: to the MCP server that lists it (``mcp_tools``)."""
        from armor_plugins.environments.mcp_tools import McpCallError, hub

        listed: dict[str, tuple[McpServerSpec, dict[str, Any]]] = {}
        down = []
        for spec in self.servers:
            try:
                listed.update({name: (spec, schema) for name, schema in (await hub().tools(spec)).items()})
            except (McpCallError, ImportError) as e:
                down.append(str(e))
        if call.name not in listed:
            names = ", ".join(sorted([*self.functions, *listed]))
            return f"error: unknown tool {call.name!r}; tools: {names}{''.join(f'; {d}' for d in down)}", True
        spec, schema = listed[call.name]
        shown = schema["function"]["parameters"]["properties"]
        unexpected = sorted(set(call.arguments) - set(shown))
        if unexpected:
            return (
                f"error: {call.name} takes no argument {', '.join(map(repr, unexpected))}; it takes {sorted(shown)}",
                True,
            )
        try:
            text, failed = await hub().call(spec, call.name, {**call.arguments, **(self.hidden.get(call.name) or {})})
        except McpCallError as e:
            return f"error: {call.name}: {e}", True
        text = text[:_MAX_RESULT_CHARS]
        return (f"error: {call.name}: {text}", True) if failed else (text, False)


def _check_local(
    tools: Sequence[str | Callable],
    parser: str,
    timeout_s: float,
    max_tool_calls_per_turn: int,
    mcp_servers: Sequence[Mapping[str, Any]] | None,
) -> dict[str, dict[str, Any]]:
    """The functions' schemas by name, and every parameter checked that needs no MCP server (see ``check_params``)."""
    if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
        raise ValueError(f"tools must be a list of 'module:function' names, got {tools!r}")
    if not tools and not mcp_servers:
        raise ValueError(
            "environment 'tools': give environment_kwargs.tools, e.g. ['my_pkg.tools:lookup'], or mcp_servers"
        )
    if parser not in PARSERS:
        close = difflib.get_close_matches(str(parser), list(PARSERS), n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown parser {parser!r}.{hint} Parsers: {', '.join(PARSERS)}")
    if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or not 0 < timeout_s < math.inf:
        raise ValueError(f"timeout_s={timeout_s!r} must be a finite number > 0 (seconds a tool call may take)")
    if not isinstance(max_tool_calls_per_turn, int) or max_tool_calls_per_turn < 1:
        raise ValueError(f"max_tool_calls_per_turn={max_tool_calls_per_turn!r} must be an integer >= 1")
    parse_servers(mcp_servers, timeout_s)
    return {f.__name__: tool_schema(f) for f in map(load_tool, tools)}


def _mcp_schemas(servers: Sequence[McpServerSpec], taken: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The MCP servers' tools' schemas by name, listed through the protocol (servers started for it are stopped
    again); a ``ValueError`` for a server that does not start, an allow-listed tool it does not offer, or a name
    that a function or another server already has."""
    if not servers:
        return {}
    from armor_plugins.environments.mcp_tools import McpCallError, hub

    try:
        mcp = hub()
    except ImportError as e:  # a ValueError: `armor run` reports it as one line
        raise ValueError(str(e)) from None
    owner = {name: f"the function {name!r} (tools)" for name in taken}
    schemas: dict[str, dict[str, Any]] = {}
    for i, spec in enumerate(servers):
        where = f"mcp_servers[{i}] ({spec.name!r})"
        try:
            listed = mcp.list_tools(spec)
        except McpCallError as e:
            raise ValueError(f"{where}: {e}") from None
        for name, schema in listed.items():
            if name in owner:
                raise ValueError(
                    f"tool {name!r} is offered by both {owner[name]} and {where}; keep one "
                    "(an MCP server's allow-list, mcp_servers[i].tools, can leave it out)"
                )
            owner[name] = where
            schemas[name] = schema
    return schemas


@hookimpl
def armor_register_environments(register: RegisterEnvironment) -> None:
    register("tools", ToolsEnvironment)
