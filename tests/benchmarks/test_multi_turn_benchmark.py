"""``benchmarks/multi_turn.py``'s environment rows: every config is one ``armor run`` accepts (the MCP one starts
the benchmark's server and lists its tool), and the server's ``lookup`` answers as the built-in function does, so
the in-process and MCP rows play the same episodes."""

from __future__ import annotations

import pytest
from mcp.server.mcpserver.exceptions import ToolError

from armor_core.config.plugin_checks import validate_plugins
from armor_core.loop.preflight import check_multi_turn
from armor_plugins.environments.builtin_tools import lookup
from armor_plugins.environments.mcp_tools import hub
from tests.benchmarks.bench_loader import load_benchmark


def test_each_environment_row_is_a_valid_run_config():
    configs = load_benchmark("multi_turn").environment_configs(4)
    assert list(configs) == [
        "tools, lookup in-process",
        "tools, lookup over MCP (stdio)",
        "textarena GuessTheNumber-v0",
    ]
    try:
        for cfg in configs.values():
            validate_plugins(cfg)
            check_multi_turn(cfg)
    finally:
        hub().close()


def test_the_mcp_server_answers_as_the_builtin_lookup():
    server = load_benchmark("mcp_table_server")
    table = {"cb": 7, "ab": 3}
    assert server.lookup("cb", table) == lookup("cb", table=table) == "7"
    with pytest.raises(ToolError) as served:
        server.lookup("zz", table)
    with pytest.raises(KeyError) as builtin:
        lookup("zz", table=table)
    assert str(served.value) == builtin.value.args[0] == "no key 'zz'; keys: ab, cb"
