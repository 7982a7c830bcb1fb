"""A tiny MCP server for the tests, on the real ``mcp`` server API: ``python table_server.py`` serves stdio,
``python table_server.py --http PORT`` streamable HTTP on 127.0.0.1:PORT (path ``/mcp``).

``lookup`` is ``recipe:tools``' built-in tool served over MCP (the row's table is a hidden argument);
``pid``, ``nap``, ``die`` and ``fail`` let the tests see the process, a hung call, a crash and an error result.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

# the ``lookup`` tool and its server are the benchmark's (benchmarks/mcp_table_server.py); the tests add theirs
sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "benchmarks"))
from mcp_table_server import app  # noqa: E402


@app.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@app.tool()
def nap(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "rested"


@app.tool()
def die() -> str:
    """Exit the server's process at once."""
    os._exit(3)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run()
