"""MCP servers as the ``tools`` environment's tools: listed through the protocol, called per tool call.

The ``mcp`` client is async (anyio) and its sessions must be used on the event loop that opened them,
while the environment is built per episode and its steps run on a rollout's own ``asyncio.run`` loop,
a new one per batch. So each process has one ``McpHub``: a daemon thread running an event loop that
owns every session. A server's connection is one task on that loop that opens the transport (a child
process for ``command``, an HTTP session for ``url``), initializes, lists the tools (``tools/list``) and
then holds the session open until it is told to stop; the transport's context managers are entered and
left by that one task, as anyio requires. Callers on any other loop or thread submit coroutines to the
hub's loop and wait with their own bound:

- connecting is bounded by the server's ``startup_timeout_s``, each call (``tools/call``) by its
  ``timeout_s``; a call past it is cancelled on the hub and answered as a failed call;
- a closed connection (a stdio server that exited, an HTTP server that went away) fails the call
  that saw it, and the next call reopens the connection (a stdio server is started again), at most
  ``max_restarts`` times, then every call says the server is down;
- ``McpHub.close()`` stops every connection: a stdio server's stdin is closed and the process is
  terminated (the SDK's ``stdio_client`` waits, then kills the process tree), an HTTP session is
  ended. It runs at interpreter exit (``atexit``); a worker killed outright (``ray.kill``) closes the
  server's stdin with its own exit, and a server that reads its stdin (every SDK's stdio server does)
  exits then.

Results: the text blocks of a ``CallToolResult`` joined by newlines (its ``structuredContent`` as JSON
when it has no text); images, audio and embedded resources are not passed on (a note says so). A
result with ``isError`` is a failed call, its text the error the policy reads.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import sys
import threading
from contextlib import AsyncExitStack
from typing import Any, Awaitable, TypeVar

from armor_plugins.environments.mcp_config import McpServerSpec, tool_spec

__all__ = ["INSTALL_HINT", "McpCallError", "McpHub", "hub", "require_mcp", "result_text"]

INSTALL_HINT = "the tools environment's mcp_servers need the mcp package: pip install 'armor-rl[mcp]'"
_T = TypeVar("_T")


def require_mcp() -> None:
    """Raise a one-line ``ImportError`` naming the ``pip install`` when ``mcp`` is not installed."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ImportError(INSTALL_HINT) from None


class McpCallError(Exception):
    """A call that did not give a result: the message is what the policy reads."""


def result_text(result: Any) -> tuple[str, bool]:
    """A ``CallToolResult``'s text and whether it is an error (see the module docstring)."""
    texts, other = [], []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", type(block).__name__)
        (texts.append(block.text) if kind == "text" else other.append(kind))
    structured = getattr(result, "structured_content", None)
    if not texts and structured is not None:
        texts.append(json.dumps(structured, ensure_ascii=False, default=str))
    if other:
        texts.append(f"[{len(other)} non-text block(s) not shown: {', '.join(sorted(set(other)))}]")
    return "\n".join(texts), bool(getattr(result, "is_error", False))


class _Connection:
    """One server's session, owned by one task on the hub's loop. Every method runs on that loop."""

    def __init__(self, spec: McpServerSpec) -> None:
        self.spec = spec
        self.tools: dict[str, dict[str, Any]] = {}  # shown schema by tool name, once listed
        self.session: Any = None
        self.starts = 0
        self.down: str | None = None  # why the server is not used any more
        self._task: asyncio.Task | None = None
        self._ready: asyncio.Future | None = None
        self._stop: asyncio.Event | None = None
        self._starting: asyncio.Lock | None = None

    def _transport(self) -> Any:
        if self.spec.command is not None:
            from mcp import StdioServerParameters, stdio_client

            env = dict(self.spec.env) if self.spec.env is not None else None
            params = StdioServerParameters(
                command=self.spec.command, args=list(self.spec.args), env=env, cwd=self.spec.cwd
            )
            return stdio_client(params, errlog=sys.stderr)
        from mcp.client.streamable_http import streamable_http_client

        client = None
        if self.spec.headers:
            from mcp.shared._httpx_utils import create_mcp_http_client

            client = create_mcp_http_client(headers=dict(self.spec.headers))
        return streamable_http_client(str(self.spec.url), http_client=client)

    async def _serve(self, ready: asyncio.Future, stop: asyncio.Event) -> None:
        from mcp import ClientSession

        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                tools, cursor = [], None
                while True:  # tools/list is paginated
                    page = await session.list_tools(params=_page(cursor))
                    tools += page.tools
                    cursor = getattr(page, "next_cursor", None)
                    if not cursor:
                        break
                self.session = session
                ready.set_result(tools)
                await stop.wait()
        except BaseException as e:  # noqa: BLE001 - a failed start is the caller's answer; a cancel still ends us
            if not ready.done():
                ready.set_exception(e if isinstance(e, Exception) else McpCallError(repr(e)))
            if isinstance(e, asyncio.CancelledError):
                raise
        finally:
            self.session = None

    async def ensure(self) -> None:
        """Connected and listed, starting (or restarting) the server when it is not."""
        self._starting = self._starting or asyncio.Lock()
        async with self._starting:  # one start at a time; a call that waited finds the server started
            if self.down:
                raise McpCallError(self.down)
            if self._task is not None and not self._task.done() and self.session is not None:
                return
            await self._start()

    async def _start(self) -> None:
        await self.stop()
        if self.starts > self.spec.max_restarts:
            self.down = f"MCP server {self.spec.name!r} is down (it closed {self.starts} times)"
            raise McpCallError(self.down)
        self.starts += 1
        self._ready, self._stop = asyncio.get_running_loop().create_future(), asyncio.Event()
        self._task = asyncio.ensure_future(self._serve(self._ready, self._stop))
        try:
            listed = await asyncio.wait_for(asyncio.shield(self._ready), self.spec.startup_timeout_s)
        except asyncio.TimeoutError:
            await self.stop()
            raise McpCallError(
                f"MCP server {self.spec.name!r} did not start within {self.spec.startup_timeout_s:g} s"
            ) from None
        except Exception as e:
            await self.stop()
            raise McpCallError(f"MCP server {self.spec.name!r} could not start: {_describe(e)}") from None
        offered = {t.name: t for t in listed}
        missing = sorted(set(self.spec.tools or ()) - set(offered))
        if missing:
            await self.stop()
            self.down = (
                f"MCP server {self.spec.name!r} offers no {', '.join(map(repr, missing))}; it offers {sorted(offered)}"
            )
            raise McpCallError(self.down)
        keep = [t for t in listed if self.spec.tools is None or t.name in self.spec.tools]
        try:
            self.tools = {t.name: tool_spec(self.spec, t.name, t.description, t.input_schema) for t in keep}
        except ValueError as e:
            await self.stop()
            self.down = str(e)
            raise McpCallError(self.down) from None

    async def call(self, tool: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        await self.ensure()
        try:
            result = await self.session.call_tool(tool, arguments, read_timeout_seconds=self.spec.timeout_s)
        except MCPError as e:
            if e.code == CONNECTION_CLOSED:  # the server went away: reopen it for the next call
                await self.stop()
                raise McpCallError(f"MCP server {self.spec.name!r} closed the connection; restarting it") from None
            if e.code == REQUEST_TIMEOUT:  # the SDK's own bound, the same as the caller's
                raise McpCallError(f"no answer within {self.spec.timeout_s:g} s") from None
            raise McpCallError(f"MCP error {e.code}: {e.message}") from None
        except Exception as e:  # a broken transport
            await self.stop()
            raise McpCallError(f"MCP server {self.spec.name!r} failed ({_describe(e)}); restarting it") from None
        return result_text(result)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if self._stop is not None:
            self._stop.set()
        if task is not None and not task.done():
            try:  # the SDK closes stdin, then terminates and kills the process; this bounds a transport that hangs
                await asyncio.wait_for(asyncio.shield(task), 10.0)
            except (asyncio.TimeoutError, Exception):
                task.cancel()
        self.session = None


def _page(cursor: str | None) -> Any:
    if cursor is None:
        return None
    from mcp_types import PaginatedRequestParams

    return PaginatedRequestParams(cursor=cursor)


def _describe(e: BaseException) -> str:
    inner = getattr(e, "exceptions", None)  # an exception group: anyio task groups wrap the transport's error
    if inner:
        return _describe(inner[0])
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class McpHub:
    """The process's MCP connections, on an event loop of their own (see the module docstring)."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="armor-mcp", daemon=True)
        self._thread.start()
        self._connections: dict[McpServerSpec, _Connection] = {}
        self._listed: dict[McpServerSpec, dict[str, dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self.closed = False

    def _submit(self, coro: Awaitable[_T]) -> concurrent.futures.Future[_T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]

    def _connection(self, spec: McpServerSpec) -> _Connection:
        with self._lock:
            if self.closed:
                raise McpCallError("the MCP connections are closed")
            return self._connections.setdefault(spec, _Connection(spec))

    def list_tools(self, spec: McpServerSpec) -> dict[str, dict[str, Any]]:
        """``spec``'s tools (shown schema by name, after its allow-list); blocking, for code outside any event
        loop (the driver's checks and prompts). A server it had to start for this is stopped again, and the
        listing is kept for the next ask. A ``McpCallError`` says why it could not."""
        if spec in self._listed:
            return dict(self._listed[spec])
        running = spec in self._connections
        conn = self._connection(spec)
        try:
            self._submit(conn.ensure()).result(spec.startup_timeout_s + 5.0)
        except concurrent.futures.TimeoutError:
            raise McpCallError(f"MCP server {spec.name!r} did not start within {spec.startup_timeout_s:g} s") from None
        finally:
            if not running:
                self.stop(spec)
        self._listed[spec] = dict(conn.tools)
        return dict(conn.tools)

    async def tools(self, spec: McpServerSpec) -> dict[str, dict[str, Any]]:
        """``list_tools`` from a coroutine on any loop, within ``startup_timeout_s``."""
        conn = self._connection(spec)
        await self._wait(conn.ensure(), spec.startup_timeout_s + 1.0, f"MCP server {spec.name!r} did not start")
        return dict(conn.tools)

    async def call(self, spec: McpServerSpec, tool: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """``tools/call`` of ``tool`` on ``spec``'s server from a coroutine on any loop: its text and whether it is an
        error result, within ``timeout_s`` (a ``McpCallError`` past it, or when there was no result)."""
        conn = self._connection(spec)
        if conn.session is None:  # connecting has its own bound
            await self.tools(spec)
        return await self._wait(conn.call(tool, arguments), spec.timeout_s, f"no answer within {spec.timeout_s:g} s")

    async def _wait(self, coro: Awaitable[_T], timeout: float, late: str) -> _T:
        future = self._submit(coro)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except asyncio.TimeoutError:
            future.cancel()  # cancels the call's task on the hub; the session stays open for the next call
            raise McpCallError(late) from None

    def stop(self, spec: McpServerSpec) -> None:
        """Stop ``spec``'s server (its next use starts it again)."""
        with self._lock:
            conn = self._connections.pop(spec, None)
        if conn is not None:
            self._submit(conn.stop()).result(15.0)

    def close(self) -> None:
        """Stop every server and the hub's loop; safe to call twice."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            connections, self._connections = list(self._connections.values()), {}

        async def stop_all() -> None:
            await asyncio.gather(*(c.stop() for c in connections), return_exceptions=True)

        try:
            self._submit(stop_all()).result(15.0)
        except Exception:  # a transport that would not close: the process's exit ends the rest
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)


_HUB: McpHub | None = None
_HUB_LOCK = threading.Lock()


def hub() -> McpHub:
    """This process's ``McpHub``, started on first use and closed at exit."""
    global _HUB
    with _HUB_LOCK:
        if _HUB is None or _HUB.closed:
            require_mcp()
            _HUB = McpHub()
            atexit.register(_HUB.close)
        return _HUB
