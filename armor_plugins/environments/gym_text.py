"""The ``gym_text`` environment: any game with gymnasium's ``reset``/``step`` API and text observations.

    data:
      task: text_game                       # rows: the game's first observation as the prompt, a seed each
      task_kwargs: ${rollout.multi_turn.environment_kwargs}
    rollout:
      multi_turn:
        enable: true
        environment: gym_text
        environment_kwargs:
          factory: my_pkg.games:make_maze   # module:function, importable in the driver and the workers
          kwargs: {size: 4}                 # passed to the factory
          answer_tag: answer                # play the text of <answer>...</answer> (null: the whole turn)
          reward: sum                       # the episode's reward: sum of the step rewards, or last
        max_turns: 8
    reward:
      domain_map: {game: game}              # the rows' data_source; the default route needs no entry

``factory(**kwargs)`` is called once per episode and must return an object with ``reset(seed=..., options=...)
-> (observation, info)`` and ``step(action: str) -> (observation, reward, terminated, truncated, info)``,
observations being text; ``close()`` is called when the episode ends if it has one. ``options`` is the row's
``extra.game_options`` (None without it). Seeds, actions, rewards and failures: see
``armor_plugins.environments.games``. A game whose package is not installed fails at start with the import
error (a missing ``gymnasium`` or ``textarena`` names ``pip install 'armor-rl[games]'``).

Not supported yet: observations that are not text (images, arrays; a gymnasium ``Dict`` space), actions that are
not text (a ``Discrete`` space: wrap the game so that ``step`` parses a string), vectorised environments, and
per-turn credit: the step rewards are summed (or the last kept) into one episode score.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any, Callable, Mapping

from armor_core import hookimpl
from armor_core.hookspecs import RegisterEnvironment
from armor_plugins.environments.games import GAMES_INSTALL, GameEnvironment, Played, check_game_params

__all__ = ["GymTextEnvironment", "load_factory"]

_GAME_PACKAGES = ("gymnasium", "textarena")


def load_factory(spec: str | Callable) -> Callable:
    """The factory named ``"module:function"`` (a callable is returned as it is); a ``ValueError`` saying why not."""
    if callable(spec):
        return spec
    module_name, _, name = str(spec).partition(":")
    if not module_name or not name:
        raise ValueError(f"factory {spec!r}: write it as 'module:function', e.g. 'my_pkg.games:make_maze'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        hint = f" ({GAMES_INSTALL})" if (e.name or "").split(".")[0] in _GAME_PACKAGES else ""
        raise ValueError(f"factory {spec!r}: cannot import it ({e}){hint}") from None
    except Exception as e:  # its import failed
        raise ValueError(f"factory {spec!r}: cannot import it ({type(e).__name__}: {e})") from None
    fn = getattr(module, name, None)
    if fn is None:
        close = difflib.get_close_matches(name, [k for k in vars(module) if not k.startswith("_")], n=1, cutoff=0.6)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"factory {spec!r}: module {module_name!r} has no {name!r}.{hint}")
    if not callable(fn):
        raise ValueError(f"factory {spec!r} is a {type(fn).__name__}, not callable")
    return fn


class GymTextEnvironment(GameEnvironment):
    """Environment ``gym_text`` (see the module docstring)."""

    def __init__(
        self,
        row: Mapping[str, Any],
        *,
        seed: int = 0,
        factory: str | Callable = "",
        kwargs: Mapping[str, Any] | None = None,
        answer_tag: str | None = None,
        reward: str = "sum",
    ) -> None:
        super().__init__(row, seed=seed, answer_tag=answer_tag, reward=reward)
        self.factory, self.kwargs = load_factory(factory), dict(kwargs or {})
        self.name = f"gym_text {factory if isinstance(factory, str) else getattr(factory, '__name__', factory)}"
        self.game: Any = None

    @staticmethod
    def check_params(
        *,
        factory: str | Callable = "",
        kwargs: Mapping[str, Any] | None = None,
        answer_tag: str | None = None,
        reward: str = "sum",
    ) -> None:
        """A ``ValueError`` naming a factory that does not import, kwargs that are not a mapping, a bad tag or mode."""
        if not factory:
            raise ValueError("environment 'gym_text': give environment_kwargs.factory, e.g. 'my_pkg.games:make_maze'")
        load_factory(factory)
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise ValueError(f"kwargs={kwargs!r} must be a mapping of the factory's keyword arguments")
        check_game_params(answer_tag, reward)

    def _start(self, seed: int, options: dict | None) -> str:
        self.game = self.factory(**self.kwargs)
        answer = self.game.reset(seed=seed, options=options)
        if not isinstance(answer, tuple) or len(answer) != 2:
            raise TypeError(f"reset returned {_shown(answer)}, not (observation, info)")
        return answer[0]

    def _play(self, action: str) -> Played:
        answer = self.game.step(action)
        if not isinstance(answer, tuple) or len(answer) != 5:
            raise TypeError(f"step returned {_shown(answer)}, not (observation, reward, terminated, truncated, info)")
        observation, reward, terminated, truncated, _ = answer
        return Played(observation, reward, _flag(terminated), _flag(truncated))

    def _stop(self) -> None:
        close = getattr(self.game, "close", None)
        if callable(close):
            close()


def _flag(value: Any) -> Any:
    """numpy's bool as a bool (gymnasium's own environments return ``np.bool_``); anything else as it is."""
    return bool(value) if type(value).__name__ == "bool_" else value


def _shown(value: Any) -> str:
    return f"a {type(value).__name__} ({str(value)[:60]!r})"


@hookimpl
def armor_register_environments(register: RegisterEnvironment) -> None:
    register("gym_text", GymTextEnvironment)
