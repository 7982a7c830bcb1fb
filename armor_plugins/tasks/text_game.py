"""The ``text_game`` task: rows for the ``gym_text`` and ``textarena`` environments, one game seed each.

``data.task: text_game`` takes the environment's own keywords as ``data.task_kwargs`` (write
``task_kwargs: ${rollout.multi_turn.environment_kwargs}`` to keep one copy): ``env_id`` makes textarena rows,
``factory`` (with ``kwargs``) gym-style rows. Each row starts its game in the driver with its seed, exactly as the
environment does in the worker, and the game's first observation is the row's prompt (one user message):

    {"prompt": [{"role": "user", "content": <the game's first observation>}], "data_source": "game",
     "ground_truth": None, "extra_info": {"game_seed": 1234, "game": "textarena GuessTheNumber-v0"}}

Seeds are drawn from ``trainer.seed`` (or ``task_kwargs.data_seed``) and the split: ``train`` seeds are even and
``test`` seeds odd, so no held-out game is a training game, whatever the seeds and sizes; within a split they are
distinct. The rows are the same on every run with the same seed, so a resumed run plays the same games. A game
whose states are few (GuessTheNumber: 20 targets) repeats states under different seeds: its held-out set is new
seeds, not necessarily new states. ``options`` (a mapping) is written to every row's ``extra_info.game_options``,
which ``gym_text`` passes to ``reset``.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from armor_core import hookimpl
from armor_core.hookspecs import RegisterTask
from armor_plugins.environments.games import GameError

__all__ = ["generate_text_game", "game_seeds"]

_SPLITS = ("train", "test")


def game_seeds(split: str, size: int, seed: int) -> list[int]:
    """``size`` distinct game seeds of ``split``: even for ``train``, odd for ``test`` (disjoint by construction)."""
    parity = _SPLITS.index(split)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x67616D65, parity])
    drawn = rng.choice(2**30, size=size, replace=False)
    return [int(s) * 2 + parity for s in drawn]


def _environment(params: Mapping[str, Any]) -> Any:
    """The environment instance the rows are made with (the same class and keywords the rollout builds)."""
    if "env_id" in params and "factory" in params:
        raise ValueError("give env_id (a textarena game) or factory (a gym-style game), not both")
    if "env_id" in params:
        from armor_plugins.environments.textarena_games import TextArenaEnvironment as cls
    elif "factory" in params:
        from armor_plugins.environments.gym_text import GymTextEnvironment as cls
    else:
        raise ValueError(
            "name the game: env_id (a textarena game, e.g. GuessTheNumber-v0) or factory (module:function)"
        )
    cls.check_params(**params)
    return cls


def generate_text_game(
    split: str,
    size: int,
    seed: int,
    *,
    data_seed: int | None = None,
    options: Mapping[str, Any] | None = None,
    **environment_kwargs: Any,
) -> list[dict[str, Any]]:
    """Rows of one game (see the module docstring); ``environment_kwargs`` are the environment's keywords."""
    split = {"val": "test", "validation": "test"}.get(split, split)
    if split not in _SPLITS:
        raise ValueError(f"text_game task: split {split!r} is not one of 'train', 'test'")
    if options is not None and not isinstance(options, Mapping):
        raise ValueError(f"text_game task: options={options!r} must be a mapping (passed to the game's reset)")
    cls = _environment(environment_kwargs)
    rows = []
    for game_seed in game_seeds(split, size, seed if data_seed is None else data_seed):
        extra = {"game_seed": game_seed, **({"game_options": dict(options)} if options is not None else {})}
        env = cls({"extra": extra}, **environment_kwargs)
        try:
            prompt = env.first_observation()
        except GameError as e:  # the game cannot start: the task's error, one line
            raise ValueError(f"game seed {game_seed}: {e}") from None
        finally:
            env.close()
        rows.append(
            {
                "prompt": [{"role": "user", "content": prompt}],
                "data_source": "game",
                "ground_truth": None,
                "extra_info": {**extra, "game": env.name},
            }
        )
    return rows


@hookimpl
def armor_register_tasks(register: RegisterTask) -> None:
    register("text_game", generate_text_game)
