"""``check_environment``: an environment run the way a multi-turn rollout runs it, on awkward turns."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Awaitable, Callable, Mapping, Sequence

from armor_core.interfaces import AssistantTurn, Environment, EnvironmentStep, capability
from armor_core.workers.rollout.multi_turn import numbers_problem
from armor_core.workers.rollout.observations import as_messages

__all__ = ["check_environment"]

#: assistant turns every environment must survive: plain text, an empty turn, a malformed tool call, a huge turn
AWKWARD_TURNS = ("The answer is 5.", "", '<tool_call>{"name": 1, "arguments": [</tool_call>', "x" * 20_000)


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


def _resolve(value: Any) -> Any:
    return asyncio.run(_awaited(value)) if inspect.isawaitable(value) else value


def _check_observation(observation: Any, where: str) -> None:
    if observation is None:
        return
    try:
        as_messages(observation)
    except ValueError as e:
        raise AssertionError(f"{where}: {e}") from None


def _check_numbers(values: Any, what: str, where: str) -> None:
    problem = numbers_problem(values, what)  # the rollout's own check: such a step ends its episode as env_error
    assert problem is None, f"{where}: {problem}"


def check_environment(
    env_cls: type[Environment] | Callable[..., Environment],
    row: Mapping[str, Any] | None = None,
    turns: Sequence[str] = AWKWARD_TURNS,
    **params: Any,
) -> list[EnvironmentStep]:
    """For each of ``turns``, build ``env_cls(row, seed=0, **params)`` and play the turn as the first of an
    episode, as the rollout does (``reset``, then ``step``; either may be async), checking what the trainer
    relies on: the step is an ``EnvironmentStep``, observations are text or chat messages, ``reward_parts``
    and ``metrics`` are finite numbers, ``prompt_kwargs`` (if defined) returns a dict, ``close`` (if
    defined) runs. Returns the steps, one per turn, for further asserts.
    """
    row = dict(row or {"prompt": "What is 2 + 3?", "data_source": "check", "ground_truth": "5", "extra": {}})
    name = getattr(env_cls, "__name__", type(env_cls).__name__)
    hook = capability("environment", env_cls, "prompt_kwargs")
    if hook is not None:
        kwargs = hook(**params)
        assert isinstance(kwargs, dict), f"{name}.prompt_kwargs returned {type(kwargs).__name__}, not a dict"
    steps: list[EnvironmentStep] = []
    for text in turns:  # each turn as the first of a fresh episode
        env = env_cls(row, seed=0, **params)
        try:
            _check_observation(_resolve(env.reset()), f"{name}.reset()")
            where = f"{name}.step({text[:40]!r})"
            step = _resolve(env.step(AssistantTurn(text, tuple(range(min(len(text), 64))), 0, True)))
            assert isinstance(step, EnvironmentStep), f"{where} returned {type(step).__name__}, not EnvironmentStep"
            _check_observation(step.observation, where)
            _check_numbers(step.reward_parts, "reward_parts", where)
            _check_numbers(step.metrics, "metrics", where)
            steps.append(step)
        finally:
            close = capability("environment", env, "close")
            if close is not None:
                _resolve(close())
    return steps
