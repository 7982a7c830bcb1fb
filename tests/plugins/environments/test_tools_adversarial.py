"""The ``tools`` environment's adversarial suite: tools that exit, raise what is not an ``Exception``, hang or
never return, sync or async. Each call ends as an ``error:`` observation the policy reads, within its
``timeout_s`` plus a little, and neither the event loop's close nor the process's exit waits for a hung one."""

import asyncio
import json
import subprocess
import sys
import threading
import time

import pytest

from armor_core.interfaces import AssistantTurn
from armor_plugins.environments.tools import ToolsEnvironment

RELEASE = threading.Event()  # set at the end of the module: the hung tools' threads then return


@pytest.fixture(scope="module", autouse=True)
def _release_hung_threads():
    yield
    RELEASE.set()


def exits(x: int) -> str:
    """Exit the way argparse does on bad arguments."""
    sys.exit(2)


def exits_zero(x: int) -> str:
    """Exit with success."""
    raise SystemExit(0)


def interrupts(x: int) -> str:
    """Raise KeyboardInterrupt from the tool's own code."""
    raise KeyboardInterrupt


def generator_exit(x: int) -> str:
    """Raise a BaseException that is not an Exception."""
    raise GeneratorExit("closed")


async def exits_async(x: int) -> str:
    """An async tool that exits."""
    sys.exit(3)


def hangs(x: int) -> str:
    """Never return (until the module's tests are over)."""
    RELEASE.wait()
    return "released"


async def blocks_the_loop(x: int) -> str:
    """An async tool that blocks instead of awaiting."""
    RELEASE.wait()
    return "released"


def deep_result(x: int) -> list:
    """Return a list nested deeper than JSON can be written."""
    out: list = []
    for _ in range(100_000):
        out = [out]
    return out


def fast(x: int) -> str:
    """Answer at once."""
    return f"fast {x}"


TOOLS = [exits, exits_zero, interrupts, generator_exit, exits_async, hangs, blocks_the_loop, deep_result, fast]


def _call(name, x=1):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': {'x': x}})}</tool_call>"


def _env(**kw):
    return ToolsEnvironment({"extra": {}}, tools=TOOLS, **kw)


def _step(env, text):
    return env.step(AssistantTurn(text, (1, 2), 0, True))


@pytest.mark.parametrize(
    "tool, error",
    [
        ("exits", "exits raised SystemExit: 2"),
        ("exits_zero", "exits_zero raised SystemExit: 0"),
        ("interrupts", "interrupts raised KeyboardInterrupt"),
        ("generator_exit", "generator_exit raised GeneratorExit: closed"),
        ("exits_async", "exits_async raised SystemExit: 3"),
        ("deep_result", "deep_result: the tool returned a list, which is neither text nor JSON (RecursionError)"),
    ],
)
def test_a_tool_that_exits_raises_a_base_exception_or_returns_what_json_cannot_write_is_an_error_observation(
    tool, error
):
    step = asyncio.run(_step(_env(), _call(tool) + _call("fast", 7)))
    first, second = (m["content"] for m in step.observation)
    assert first == f"error: {error}" and second == "fast 7"  # the turn's other call still answers
    assert step.metrics["tool_errors"] == 1 and not step.done


@pytest.mark.parametrize("tool", ["hangs", "blocks_the_loop"])
def test_a_tool_that_never_returns_is_an_error_after_its_timeout_and_the_loop_closes(tool):
    start = time.perf_counter()
    step = asyncio.run(_step(_env(timeout_s=0.3), _call(tool)))  # asyncio.run closes its loop before returning
    assert time.perf_counter() - start < 1.5
    assert step.observation[0]["content"] == f"error: {tool} did not answer within 0.3 s"


def test_fast_calls_do_not_queue_behind_hung_ones():
    # eight episodes whose tool hangs, then one whose tool answers at once, all on one event loop as a rollout runs
    # them: with a shared pool of a few threads the fast call waited for a free one and timed out too
    async def batch():
        hung = [_step(_env(timeout_s=1.0), _call("hangs")) for _ in range(8)]
        await asyncio.sleep(0.1)
        tasks = [asyncio.ensure_future(h) for h in hung]
        await asyncio.sleep(0.1)
        started = time.perf_counter()
        quick = await _step(_env(timeout_s=1.0), _call("fast", 5))
        waited = time.perf_counter() - started
        return quick, waited, await asyncio.gather(*tasks)

    quick, waited, hung = asyncio.run(batch())
    assert quick.observation[0]["content"] == "fast 5" and waited < 0.5
    assert all(h.observation[0]["content"].startswith("error: hangs did not answer") for h in hung)


@pytest.mark.slow
def test_the_process_exits_while_a_tool_still_hangs():
    program = (
        "import asyncio, json, threading\n"
        "from armor_core.interfaces import AssistantTurn\n"
        "from armor_plugins.environments.tools import ToolsEnvironment\n"
        "def hangs(x: int) -> str:\n"
        "    '''Never return.'''\n"
        "    threading.Event().wait()\n"
        "env = ToolsEnvironment({}, tools=[hangs], timeout_s=0.2)\n"
        "call = '<tool_call>' + json.dumps({'name': 'hangs', 'arguments': {'x': 1}}) + '</tool_call>'\n"
        "step = asyncio.run(env.step(AssistantTurn(call, (1,), 0, True)))\n"
        "print(step.observation[0]['content'])\n"
    )
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "error: hangs did not answer within 0.2 s"


@pytest.mark.parametrize(
    "arguments, error",
    [("[" * 200_000 + "]" * 200_000, "nested too deeply"), ("9" * 100_000, "more than 4300 digits")],
    ids=["deep", "huge int"],
)
def test_a_call_whose_json_cannot_be_read_is_an_error_observation_naming_why(arguments, error):
    text = '<tool_call>{"name": "fast", "arguments": {"x": ' + arguments + "}}</tool_call>"
    step = asyncio.run(_step(_env(), text))
    assert step.observation[0]["content"].startswith("error: ") and error in step.observation[0]["content"]
    assert step.metrics["tool_errors"] == 1 and not step.done
