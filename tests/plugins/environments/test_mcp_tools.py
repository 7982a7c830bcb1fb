"""MCP servers' tools in the ``tools`` environment, against real servers of the ``mcp`` SDK (``mcp_servers/``, a
stdio process and a streamable-HTTP one): tools are listed through the protocol without their hidden parameters,
a call gets the row's hidden arguments, a hung call fails in about its timeout and the next one works, a server
that exits fails its call and is started again, closing leaves no server process, and bad config, a name taken
twice or a missing ``mcp`` package is one clear error."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from armor_core.interfaces import AssistantTurn
from armor_plugins.environments import mcp_tools
from armor_plugins.environments.mcp_tools import hub
from armor_plugins.environments.tools import ToolsEnvironment

ROW = {"extra": {"tools_kwargs": {"lookup": {"table": {"qx": 7, "ab": 3}}}}}


@pytest.fixture
def stdio(mcp_table_server):
    """The stdio table server's ``mcp_servers`` entry, with a test's own keys."""
    return lambda **kw: {**mcp_table_server, **kw}


@pytest.fixture(autouse=True)
def _fresh_hub():
    """Each test starts and stops its own servers: the process's hub is closed after it."""
    yield
    hub().close()


def _step(env: ToolsEnvironment, name: str, **args) -> tuple[str, float]:
    text = f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"
    out = asyncio.run(env.step(AssistantTurn(text, (1,), 0, True)))
    assert out.observation is not None and len(out.observation) == 1
    return out.observation[0]["content"], out.metrics["tool_errors"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_stdio_tools_are_listed_without_hidden_parameters_and_called_with_the_rows(stdio):
    schemas = ToolsEnvironment.check_params(mcp_servers=[stdio()])
    assert sorted(schemas) == ["die", "lookup", "nap", "pid"]
    shown = schemas["lookup"]["function"]
    assert shown["description"] == "Read the value stored under a key."
    assert shown["parameters"]["properties"] == {"key": {"type": "string"}}  # table is the row's, titles dropped
    assert ToolsEnvironment.prompt_kwargs(mcp_servers=[stdio()])["tools"] == list(schemas.values())
    env = ToolsEnvironment(ROW, mcp_servers=[stdio()])
    assert _step(env, "lookup", key="qx") == ("7", 0.0)
    text, errors = _step(env, "lookup", key="zz")  # the server's error result is a failed call the policy reads
    assert errors == 1.0 and text.startswith("error: lookup:") and "no key 'zz'; keys: ab, qx" in text
    text, errors = _step(env, "lookup", key="qx", table={"qx": 0})  # the policy may not set a hidden argument
    assert errors == 1.0 and "takes no argument 'table'" in text
    assert _step(env, "nope")[0] == "error: unknown tool 'nope'; tools: die, lookup, nap, pid"


def test_the_allow_list_keeps_only_the_named_tools(stdio):
    env = ToolsEnvironment(ROW, mcp_servers=[stdio(tools=["lookup"])])
    assert _step(env, "pid")[0] == "error: unknown tool 'pid'; tools: lookup"
    with pytest.raises(ValueError, match=r"mcp_servers\[0\] \('tables'\).*offers no 'search'; it offers \['die'"):
        ToolsEnvironment.check_params(mcp_servers=[stdio(tools=["lookup", "search"])])


def test_a_hung_call_fails_in_about_its_timeout_and_the_next_call_is_answered(stdio):
    env = ToolsEnvironment(ROW, mcp_servers=[stdio(timeout_s=1.0)])
    assert _step(env, "pid")[1] == 0.0  # started: the timeout is the call's alone
    started = time.monotonic()
    text, errors = _step(env, "nap", seconds=30)
    took = time.monotonic() - started
    assert (text, errors) == ("error: nap: no answer within 1 s", 1.0)
    assert 0.9 < took < 3.0
    assert _step(env, "lookup", key="ab") == ("3", 0.0)


def test_a_server_that_exits_fails_its_call_and_is_started_again_up_to_max_restarts(stdio):
    env = ToolsEnvironment(ROW, mcp_servers=[stdio(max_restarts=1)])
    first = int(_step(env, "pid")[0])
    text, errors = _step(env, "die")
    assert errors == 1.0 and "closed the connection" in text
    second = int(_step(env, "pid")[0])  # a new process
    assert second != first and not _alive(first)
    _step(env, "die")
    text, errors = _step(env, "pid")  # restarted once already: reported, not restarted
    assert errors == 1.0 and "is down" in text


def test_closing_stops_the_server_process(stdio):
    env = ToolsEnvironment(ROW, mcp_servers=[stdio()])
    pid = int(_step(env, "pid")[0])
    assert _alive(pid)
    hub().close()
    assert not _alive(pid)  # stopped and reaped, not orphaned
    assert _step(env, "lookup", key="qx") == ("7", 0.0)  # a later use starts a new hub and server


def test_a_server_that_does_not_start_is_a_config_error_naming_it_and_a_failed_call_in_a_worker(tmp_path, stdio):
    broken = stdio(args=[str(tmp_path / "missing.py")], startup_timeout_s=10)
    with pytest.raises(ValueError, match=r"mcp_servers\[0\] \('tables'\): MCP server 'tables' could not start"):
        ToolsEnvironment.check_params(mcp_servers=[broken])
    text, errors = _step(ToolsEnvironment(ROW, mcp_servers=[broken]), "lookup", key="qx")
    assert errors == 1.0 and text.startswith("error: unknown tool 'lookup'") and "could not start" in text


@pytest.fixture(scope="module")
def http_url(mcp_table_server):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, *mcp_table_server["args"], "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.kill()  # uvicorn's graceful stop would wait for the abandoned nap
    proc.wait(10)


def test_a_streamable_http_server_is_listed_and_called_with_the_rows_hidden_arguments(http_url):
    spec = {"name": "remote", "url": http_url, "hidden": ["table"], "tools": ["lookup", "nap"], "timeout_s": 1}
    assert sorted(ToolsEnvironment.check_params(mcp_servers=[spec])) == ["lookup", "nap"]
    env = ToolsEnvironment(ROW, mcp_servers=[spec])
    assert _step(env, "lookup", key="qx") == ("7", 0.0)
    started = time.monotonic()
    text, errors = _step(env, "nap", seconds=5)
    assert (text, errors) == ("error: nap: no answer within 1 s", 1.0) and time.monotonic() - started < 3.0
    assert _step(env, "lookup", key="ab") == ("3", 0.0)


@pytest.mark.parametrize(
    ("servers", "message"),
    [
        ({"name": "x", "command": "python"}, r"mcp_servers must be a list of servers"),
        ([{"command": "python"}], r"mcp_servers\[0\]\.name=None: give a name"),
        ([{"name": "x"}], r"mcp_servers\[0\] \('x'\): give either command .* or url"),
        ([{"name": "x", "command": "python", "url": "http://h/mcp"}], r"give either command"),
        ([{"name": "x", "url": "ftp://h"}], r"\.url='ftp://h' must be an http:// or https:// address"),
        ([{"name": "x", "url": "http://h/mcp", "args": ["a"]}], r"args do not apply to a url"),
        ([{"name": "x", "command": "python", "timeout": 3}], r"unknown key\(s\) 'timeout'; keys: .*timeout_s"),
        ([{"name": "x", "command": "python", "timeout_s": 0}], r"\.timeout_s=0 must be a finite number of seconds"),
        ([{"name": "x", "command": "python", "args": "s.py"}], r"\.args must be a list of strings"),
        ([{"name": "x", "command": "a"}, {"name": "x", "url": "http://h/m"}], r"'x' are given to more than one"),
    ],
)
def test_bad_server_config_names_the_key_and_what_is_right(servers, message):
    with pytest.raises(ValueError, match=message):
        ToolsEnvironment.check_params(mcp_servers=servers)


def test_a_tool_name_offered_by_a_function_and_a_server_is_refused_naming_both(stdio):
    with pytest.raises(ValueError, match=r"'lookup' is offered by both the function 'lookup' .* and mcp_servers\[0\]"):
        ToolsEnvironment.check_params(tools=["armor_plugins.environments.builtin_tools:lookup"], mcp_servers=[stdio()])


def test_without_the_mcp_package_the_error_is_one_line_naming_the_install(monkeypatch, stdio):
    monkeypatch.setitem(sys.modules, "mcp", None)  # `import mcp` raises ImportError
    monkeypatch.setattr(mcp_tools, "_HUB", None)
    with pytest.raises(ValueError) as e:
        ToolsEnvironment.check_params(mcp_servers=[stdio()])
    assert "\n" not in str(e.value) and "pip install 'armor-rl[mcp]'" in str(e.value)
