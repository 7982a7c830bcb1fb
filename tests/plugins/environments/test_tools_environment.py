"""The built-in ``tools`` environment: parallel calls run concurrently, every failure of a call is an
error observation the policy reads (never an exception), per-row hidden arguments win over the
policy's, and a turn without a call ends the episode. Also the environment contract's check and
registration through the hook."""

import asyncio
import time

import pytest

from armor_core import hookimpl
from armor_core.interfaces import AssistantTurn, EnvironmentStep
from armor_core.testing import check_environment, registered
from armor_plugins.environments.tools import ToolsEnvironment, load_tool


def lookup(key: str, *, table: dict | None = None) -> str:
    """Read one value of the table.

    Args:
        key: the row's key.
    """
    return (table or {}).get(key, "missing")


def slow(seconds: float) -> str:
    """Sleep."""
    time.sleep(seconds)
    return "slept"


def broken(x: int) -> int:
    """Raise."""
    raise RuntimeError("disk on fire")


def opaque(x: int) -> object:
    """Return something that is not JSON."""
    return object()


def _call(name, **args):
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def _step(env, text, index=0):
    return asyncio.run(env.step(AssistantTurn(text, (1, 2), index, True)))


def _env(row=None, **kw):
    return ToolsEnvironment(row or {"extra": {}}, tools=[lookup, slow, broken, opaque], **kw)


def test_a_turn_without_a_call_is_the_final_answer():
    assert _step(_env(), "The answer is 42.") == EnvironmentStep(done=True)


def test_hidden_per_row_arguments_win_over_the_policys():
    env = _env({"extra": {"tools_kwargs": {"lookup": {"table": {"a": "1", "b": "2"}}}}})
    step = _step(env, _call("lookup", key="b"))
    assert step.observation == [{"role": "tool", "content": "2"}] and not step.done
    forged = _step(env, _call("lookup", key="b", table={"b": "forged"}))  # the policy cannot set a hidden one
    assert "takes no argument 'table'" in forged.observation[0]["content"]
    assert (
        "table"
        not in ToolsEnvironment.prompt_kwargs(tools=[lookup])["tools"][0]["function"]["parameters"]["properties"]
    )
    assert step.metrics["tool_calls"] == 1 and step.metrics["tool_errors"] == 0


def test_parallel_calls_run_concurrently_in_order():
    env = _env(timeout_s=5)
    start = time.perf_counter()
    step = _step(env, _call("slow", seconds=0.5) * 3)
    assert time.perf_counter() - start < 1.2  # three half-second calls at once
    assert [m["content"] for m in step.observation] == ["slept"] * 3  # a str result goes back as it is


@pytest.mark.parametrize(
    "text, error",
    [
        (_call("nosuch", x=1), "unknown tool 'nosuch'"),
        (_call("broken", x=1), "broken raised RuntimeError: disk on fire"),
        (_call("opaque", x=1), "neither text nor JSON"),
        (_call("lookup", wrong=1), "takes no argument 'wrong'"),
        (_call("lookup"), "missing a required argument: 'key'"),
        ("<tool_call>{oops}</tool_call>", "not valid JSON"),
        (_call("slow", seconds=3), "did not answer within 0.3 s"),
    ],
)
def test_every_failure_is_an_error_observation(text, error):
    step = _step(_env(timeout_s=0.3), text)
    (message,) = step.observation
    assert message["role"] == "tool" and message["content"].startswith("error:") and error in message["content"]
    assert step.metrics["tool_errors"] == 1 and not step.done


def test_calls_past_the_limit_are_refused():
    step = _step(_env(max_tool_calls_per_turn=2), _call("lookup", key="a") * 3)
    assert [m["content"] for m in step.observation][-1].startswith("error: at most 2 tool calls")
    assert step.metrics["tool_errors"] == 1 and step.metrics["tool_calls"] == 3


def test_tools_are_named_by_import_path_and_schemas_reach_the_prompt():
    assert load_tool("json:dumps").__name__ == "dumps"
    with pytest.raises(ValueError, match="write it as 'module:function'"):
        load_tool("json.dumps")
    with pytest.raises(ValueError, match="cannot import it"):
        load_tool("no_such_module:f")
    kwargs = ToolsEnvironment.prompt_kwargs(tools=[lookup])
    assert kwargs["tools"][0]["function"]["name"] == "lookup"
    with pytest.raises(ValueError, match="give environment_kwargs.tools"):
        ToolsEnvironment({"extra": {}})


def test_the_contract_check_passes_the_builtin_and_catches_a_bad_environment():
    steps = check_environment(ToolsEnvironment, tools=[lookup])
    assert steps[0].done and steps[2].metrics["tool_errors"] == 1

    class Bad:
        def __init__(self, row, seed=0):
            pass

        def reset(self):
            return None

        def step(self, turn):
            return EnvironmentStep(observation=42)

    with pytest.raises(AssertionError, match="an observation must be text or chat messages"):
        check_environment(Bad)


@pytest.mark.parametrize(
    "step",
    [
        EnvironmentStep(done=True, reward_parts={"r": "high"}),
        EnvironmentStep(done=True, reward_parts={"r": None}),
        EnvironmentStep(done=True, reward_parts={"r": float("nan")}),
        EnvironmentStep(done=True, reward_parts=[1.0]),
        EnvironmentStep(done=True, metrics={"m": [1, 2]}),
    ],
    ids=["text", "none", "nan", "list", "metric list"],
)
def test_check_environment_refuses_what_the_rollout_would_end_as_env_error(step):
    # issue 42, item 7: the check an author runs refuses what a run counts as a failed episode, by the same rule
    class Parts:
        def __init__(self, row, seed=0):
            pass

        def reset(self):
            return None

        def step(self, turn):
            return step

    with pytest.raises(AssertionError, match=r"Parts\.step\(.*\): .*(reward_parts|metrics)"):
        check_environment(Parts)


def test_environments_register_through_the_hook():
    class Echo:
        def __init__(self, row, seed=0):
            self.row = row

        async def reset(self):
            return None

        async def step(self, turn):
            return EnvironmentStep(observation=turn.text, done=turn.index >= 1)

    class Plugin:
        @staticmethod
        @hookimpl
        def armor_register_environments(register):
            register("echo", Echo)

    with registered(Plugin, load_entrypoints=False) as pm:
        assert pm.names("environment") == ["echo"]
        assert check_environment(pm.get("environment", "echo"))[0].observation == "The answer is 5."


def test_builtin_calculator_and_lookup():
    from armor_plugins.environments.builtin_tools import calculator
    from armor_plugins.environments.builtin_tools import lookup as builtin_lookup

    assert calculator("(17 + 25) * 3") == "126" and calculator("7 / 2") == "3.5" and calculator("-2 ** 3") == "-8"
    for bad, message in [
        ("__import__('os')", "not arithmetic"),
        ("2 ** 1000", "exponent 1000"),
        ("9 ** 64 * 9 ** 64", "more than 64 digits"),
        ("1 / 0", "division by zero"),
        ("1 +", "not an arithmetic expression"),
        ("1" * 300, "longer than 200"),
    ]:
        with pytest.raises(ValueError, match=message):
            calculator(bad)
    assert builtin_lookup("a", table={"a": 1}) == "1"
    with pytest.raises(KeyError, match="no key 'b'"):
        builtin_lookup("b", table={"a": 1})
