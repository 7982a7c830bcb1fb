"""The ``lookup`` tool of ``recipe:tools`` (``armor_plugins.environments.builtin_tools:lookup``) as a stdio MCP
server on the ``mcp`` SDK's server API, for ``benchmarks/multi_turn.py``: ``python mcp_table_server.py``.

The row's table is a hidden argument (the benchmark's ``mcp_servers`` entry lists ``table`` as ``hidden``), so the
policy's call and the tool's answer are the built-in function's, byte for byte.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

app = MCPServer("armor-benchmark-tables", log_level="WARNING")  # a failed call is the policy's, not a log line


@app.tool()
def lookup(key: str, table: dict | None = None) -> str:
    """Read the value stored under a key."""
    if not table:
        raise ToolError("this row has no table (extra.tools_kwargs.lookup.table)")
    if key not in table:
        raise ToolError(f"no key {key!r}; keys: {', '.join(sorted(map(str, table)))}")
    return str(table[key])


if __name__ == "__main__":
    app.run()
