"""What the text-game environments share: one game per episode, its observations as user turns, the policy's turn
(or the text inside an answer tag) as its action, its rewards as the episode's ``game_reward``.

``GameEnvironment`` is the part of the ``gym_text`` and ``textarena`` environments that does not depend on the
game's package: a subclass says how to start its game (``_start(seed, options) -> first observation``) and how to
play one action (``_play(action) -> Played``). Here:

- **Seeds.** A row's game is started with the row's ``extra.game_seed`` (the ``text_game`` task writes one per row,
  train and held-out sets disjoint), so the prompt the task wrote (the game's first observation) is the state the
  game is in, whatever step or worker plays it, and a resumed run plays the same games. ``extra.game_options``
  (a mapping) is passed to the game's reset where the adapter takes options. A row without ``game_seed`` plays
  the episode's seed (different on every step: its prompt must then not depend on the game's state).
- **Actions.** ``answer_tag: answer`` plays the text of the turn's last ``<answer>...</answer>``; a turn without
  one plays its whole text, counted as ``game_untagged``. Without ``answer_tag`` the whole turn is the action.
  The text is stripped of surrounding whitespace.
- **Rewards.** ``reward: sum`` adds the step rewards, ``reward: last`` keeps the last one given. Each step reports
  its share of the episode's reward as the metric ``game_reward`` (with ``last``, the change from the previous
  one), so the episode's metrics sum to it; the ``game`` reward domain scores a row with that sum, and fails the
  row when the game failed (``armor_plugins/rewards/game.py``). Every step also counts ``game_steps``, and a game
  that ended counts ``game_terminated`` or ``game_truncated``.
- **Failures.** Whatever the game raises is re-raised as ``GameError`` naming the game (``"textarena
  GuessTheNumber-v0: step raised ValueError: ..."``), and so is an answer of the wrong type (an observation that
  is not text, a reward that is not a finite number, a flag that is not a bool): the rollout ends the episode as
  ``env_error`` and the ``game`` domain fails its row with that message. A game that does not answer within
  ``rollout.multi_turn.step_timeout_s`` ends as ``env_timeout`` (its thread is abandoned, as every environment's).
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from armor_core.errors import UserFacingError
from armor_core.interfaces import AssistantTurn, EnvironmentStep
from armor_core.ops.calls import describe

__all__ = [
    "GAMES_INSTALL",
    "REWARD_MODES",
    "GameEnvironment",
    "GameError",
    "GamesMissingError",
    "Played",
    "check_game_params",
    "parse_action",
    "require",
]

GAMES_INSTALL = "pip install 'armor-rl[games]'"
REWARD_MODES = ("sum", "last")
_TAG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


class GamesMissingError(UserFacingError, ImportError):
    """A game package (textarena, gymnasium) is not installed: one line saying what to install."""


class GameError(RuntimeError):
    """The game failed (raised, or answered with the wrong types); the message names the game."""


def require(module: str, what: str) -> Any:
    """The imported ``module``, or a one-line ``GamesMissingError`` naming ``what`` needs it and how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise GamesMissingError(f"{what} needs the {module} package: {GAMES_INSTALL}") from None


def check_game_params(answer_tag: str | None, reward: str) -> None:
    """A ``ValueError`` naming a bad ``answer_tag`` or ``reward``."""
    if answer_tag is not None and (not isinstance(answer_tag, str) or not _TAG_NAME.fullmatch(answer_tag)):
        raise ValueError(f"answer_tag={answer_tag!r} must be a tag name such as 'answer' (or null: the whole turn)")
    if reward not in REWARD_MODES:
        raise ValueError(f"reward={reward!r} must be one of {', '.join(REWARD_MODES)}")


def parse_action(text: str, answer_tag: str | None) -> tuple[str, bool]:
    """The action a turn plays and whether it came from the answer tag (always True without a tag)."""
    if answer_tag is None:
        return text.strip(), True
    found = re.findall(rf"<{re.escape(answer_tag)}>(.*?)</{re.escape(answer_tag)}>", text, flags=re.DOTALL)
    if not found:
        return text.strip(), False
    return found[-1].strip(), True


@dataclass
class Played:
    """A game's answer to one action: the next observation (text), the step's reward (None: none given),
    whether the game ``terminated`` or was ``truncated``, and numbers of its own to log."""

    observation: str | None
    reward: float | None = None
    terminated: bool = False
    truncated: bool = False
    metrics: dict[str, float] = field(default_factory=dict)


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise TypeError(f"{what} is {value!r} ({type(value).__name__}), not a finite number")
    return float(value)


class GameEnvironment:
    """One game per episode (see the module docstring); a subclass sets ``name`` and defines ``_start``/``_play``."""

    name = "game"

    def __init__(
        self, row: Mapping[str, Any], *, seed: int = 0, answer_tag: str | None = None, reward: str = "sum"
    ) -> None:
        check_game_params(answer_tag, reward)
        extra = row.get("extra") or {}
        extra = extra if isinstance(extra, Mapping) else {}
        self.game_seed = int(extra["game_seed"]) if extra.get("game_seed") is not None else int(seed)
        options = extra.get("game_options")
        self.options = dict(options) if isinstance(options, Mapping) else None
        self.answer_tag, self.mode = answer_tag, reward
        self.total = 0.0  # the episode's reward so far (``last``: the last one given)

    # -- what a subclass defines -----------------------------------------------------------------

    def _start(self, seed: int, options: dict | None) -> str:
        raise NotImplementedError

    def _play(self, action: str) -> Played:
        raise NotImplementedError

    def _stop(self) -> None:
        """Release the game (called once the episode ended, also when it failed)."""

    # -- the environment contract ----------------------------------------------------------------

    def first_observation(self) -> str:
        """Start the game with the row's seed and return its first observation (the ``text_game`` task's prompt)."""
        observation = self._guarded("reset", self._start, self.game_seed, self.options)
        if not isinstance(observation, str):
            raise GameError(f"{self.name}: reset's observation is a {type(observation).__name__}, not text")
        return observation

    def reset(self) -> None:
        self.first_observation()  # the prompt already holds it
        return None

    def step(self, turn: AssistantTurn) -> EnvironmentStep:
        action, tagged = parse_action(turn.text, self.answer_tag)
        played = self._guarded("step", self._play, action)
        try:
            reward = None if played.reward is None else _number(played.reward, "the step's reward")
            metrics = {k: _number(v, f"metric {k!r}") for k, v in played.metrics.items()}
            for flag in ("terminated", "truncated"):
                if not isinstance(getattr(played, flag), bool):
                    raise TypeError(f"{flag} is {getattr(played, flag)!r}, not a bool")
            if played.observation is not None and not isinstance(played.observation, str):
                raise TypeError(f"the observation is a {type(played.observation).__name__}, not text")
        except TypeError as e:
            raise GameError(f"{self.name}: step returned the wrong type: {e}") from None
        share = 0.0
        if reward is not None:
            share = reward if self.mode == "sum" else reward - self.total
            self.total = self.total + reward if self.mode == "sum" else reward
        metrics.update(game_reward=share, game_steps=1.0, game_untagged=float(not tagged))
        done = played.terminated or played.truncated
        if done:
            metrics["game_terminated" if played.terminated else "game_truncated"] = 1.0
        return EnvironmentStep(observation=None if done else played.observation, done=done, metrics=metrics)

    def close(self) -> None:
        self._stop()

    def _guarded(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except GameError:
            raise
        except (Exception, SystemExit) as e:  # the package's own error, named by the game
            raise GameError(f"{self.name}: {what} raised {describe(e)}") from e
