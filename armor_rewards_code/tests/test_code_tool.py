"""The ``python`` tool: what a call answers (output, errors, limits), that a policy's code cannot escape the
sandbox through it, and a scripted turn of the ``tools`` environment that calls it."""

import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import pytest
from armor_rewards_code.tool import MAX_CHARS, python

from armor_core.interfaces import AssistantTurn
from armor_plugins.environments.tools import ToolsEnvironment

SECRET = "armor-tool-secret-value"
CANARY = Path(__file__).parent / "armor-tool-canary"  # on the host's disk, outside any scratch directory
LIMITS = {"timeout_s": 1.0, "memory_mb": 256}


def test_a_call_answers_what_the_program_printed_or_what_went_wrong():
    assert python("print(2 ** 10)") == "1024\n"
    assert python("x = 1") == "(no output)"
    failed = python("import sys\nprint('partial')\nprint('to stderr', file=sys.stderr)\nsys.exit(3)")
    assert failed.startswith("partial\n[stderr]\nto stderr") and failed.endswith("error: exit status 3")
    crashed = python("def f():\n    return 1 / 0\nf()")
    assert 'File "solution.py", line 2, in f' in crashed and "ZeroDivisionError" in crashed
    assert "harness" not in crashed and "_stdio_child" not in crashed  # the program's frames, not ours
    assert python("print(").startswith("error: SyntaxError")
    assert python("   ") == "error: no code to run"
    long = python("print('x' * 100000)", **LIMITS)
    assert long.startswith("x" * MAX_CHARS) and "more characters]" in long and long.endswith("output over 8000 bytes")
    assert len(long) < MAX_CHARS + 200


ATTACKS = {
    "infinite loop": "while True:\n    pass",
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "10 GB allocation": "x = bytearray(10 * 1024 ** 3)\nprint('escaped')",
    "socket connect": "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=0.5)\nprint('escaped')",
    "write outside": f"open({str(CANARY)!r}, 'w').write('x')\nprint('escaped')",
    "environment secrets": "import os\nprint('escaped' if os.environ.get('ARMOR_SECRET') else 'clean')",
    "kill the parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.killpg(0, 9)",
    "fill the disk": "b = b'x' * (1 << 20)\nwith open('big', 'wb') as f:\n    while True:\n        f.write(b)",
    "setsid escape": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(30)\nprint('parent done')",
}


@pytest.mark.parametrize("name", ATTACKS)
def test_a_policys_code_cannot_escape_through_the_tool(name, monkeypatch, processes):
    from armor_rewards_code import tool

    if name in ("socket connect", "write outside") and not tool._sandbox(256, False).isolated:
        pytest.skip(
            f"this kernel grants neither namespaces nor seccomp and Landlock: {tool._sandbox(256, False).confinement.why}"
        )
    monkeypatch.setenv("ARMOR_SECRET", SECRET)
    before = set(os.listdir(tempfile.gettempdir()))
    start = time.monotonic()
    answer = python(ATTACKS[name], **LIMITS)
    assert time.monotonic() - start < LIMITS["timeout_s"] + 1.0 + 0.5  # its limit, reaping, and a loaded machine
    assert "escaped" not in answer and SECRET not in answer, answer
    assert not CANARY.exists()
    # other jobs of a shared machine write to /tmp too: what the sandbox or these programs would leave
    left = {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("armor-code") or n == "big"}
    assert left == set()
    if os.geteuid() == 0:  # without root a setsid escapee lives on until its CPU limit (the pack's README)
        deadline = time.monotonic() + 2.0
        while processes.leftover() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert processes.leftover() == []


def _turn(env, text):
    return asyncio.run(env.step(AssistantTurn(text, (1, 2), 0, True)))


def _call(**arguments):
    return f"<tool_call>{json.dumps({'name': 'python', 'arguments': arguments})}</tool_call>"


def test_the_tools_environment_runs_a_python_call_and_keeps_the_limits_hidden():
    tools = ["armor_rewards_code.tool:python"]
    schema = ToolsEnvironment.prompt_kwargs(tools=tools)["tools"][0]["function"]
    assert schema["name"] == "python" and list(schema["parameters"]["properties"]) == ["code"]
    env = ToolsEnvironment({"extra": {"tools_kwargs": {"python": {"timeout_s": 1.0}}}}, tools=tools, timeout_s=10)
    step = _turn(env, "Let me compute it. " + _call(code="print(sum(range(10)))"))
    assert step.observation == [{"role": "tool", "content": "45\n"}] and not step.done
    assert step.metrics["tool_calls"] == 1 and step.metrics["tool_errors"] == 0
    start = time.monotonic()  # the row's hidden timeout_s (1 s) holds, not the tool's default of 5 s
    looped = _turn(env, _call(code="while True: pass"))
    assert time.monotonic() - start < 3.0 and "ran past its 1 s limit" in looped.observation[0]["content"]
    forged = _turn(env, _call(code="print(1)", timeout_s=100))  # the policy cannot lift its limits
    assert "takes no argument 'timeout_s'" in forged.observation[0]["content"]
    assert forged.metrics["tool_errors"] == 1
    assert _turn(env, "The sum is 45.").done  # no call: the final answer


def test_a_program_that_kills_its_harness_is_told_what_happened_not_a_time_limit(mode):
    # in its own PID namespace the harness is the namespace's init, which the program cannot kill; elsewhere it can
    start = time.monotonic()
    answer = python("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.killpg(0, signal.SIGKILL)", **LIMITS)
    assert time.monotonic() - start < 1.0
    assert "limit" not in answer and "stopped after" not in answer, answer
    assert answer.startswith("error: ") and "SIGKILL" in answer, answer
