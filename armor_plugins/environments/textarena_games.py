"""The ``textarena`` environment: a single-player textarena game (textarena 0.7.x) by its env id.

    data:
      task: text_game
      task_kwargs: ${rollout.multi_turn.environment_kwargs}
    rollout:
      multi_turn:
        enable: true
        environment: textarena
        environment_kwargs:
          env_id: GuessTheNumber-v0   # any id of textarena's registry whose game is single-player
          answer_tag: null            # textarena games read their own format ("[12]"); or: answer
        max_turns: 10

The game is made from textarena's registry *without* its wrappers (the entry point with the id's arguments), so
that an observation is only what the game said since the policy's last turn: textarena's default
``LLMObservationWrapper`` repeats the whole history each turn, which a multi-turn rollout already holds as tokens.
Each episode: ``reset(num_players=1, seed=<the row's game_seed>)``; the prompt is the game's first observation
(the ``text_game`` task reads it the same way); each turn ``step(action)``, then ``get_observation()``'s new
messages from the game (the echo of the policy's own action dropped) joined by newlines as the next user turn;
when ``step`` says done, ``close()``'s reward for player 0 is the episode's reward, and the invalid-move flag of
its game info is counted (``game_invalid_move``). textarena gives no per-step rewards: an episode that ARMOR's
``max_turns`` cuts before the game ends scores 0.

Offline without downloads (checked with textarena 0.7.4, ``tests/plugins/environments/test_textarena_games.py``):
``GuessTheNumber-v0``, ``TowerOfHanoi-v0``, ``Minesweeper-v0-small``, ``FifteenPuzzle-v0``, ``Sudoku-v0-very-easy``,
``LightsOut-v0``, ``FrozenLake-v0``, ``Mastermind-v0``, ``PegJump-v0``, ``Bandit-v0``, ``Blackjack-v0`` and their
harder variants. ``Hangman-v0`` and ``Wordle-v0`` load nltk word lists (a download): they fail every row.
``Countdown-v0`` and ``Cryptarithm-v0`` echo a move as a message that is not text (and give a text reward for an
invalid move): their rows fail, named, at the first move.

Not supported yet: games of two or more players (the policy would have to play every seat, or an opponent be
configured), textarena's online play and its wrappers, and reproducible randomness *after* reset: textarena seeds
Python's global ``random`` in ``reset``, which ARMOR calls one episode at a time, while the games' steps run
concurrently on threads, so a game that draws random numbers in ``step`` is not reproducible run to run.
"""

from __future__ import annotations

import difflib
from typing import Any, Mapping

from armor_core import hookimpl
from armor_core.hookspecs import RegisterEnvironment
from armor_plugins.environments.games import GameEnvironment, GameError, Played, check_game_params, require

__all__ = ["TextArenaEnvironment", "make_game"]

_PLAYER = 0


def make_game(env_id: str) -> Any:
    """A fresh, unwrapped textarena game for ``env_id``; a ``ValueError`` naming the nearest id for an unknown one."""
    require("textarena", f"the textarena environment ({env_id!r})")
    from textarena.envs.registration import ENV_REGISTRY

    spec = ENV_REGISTRY.get(env_id)
    if spec is None:
        close = difflib.get_close_matches(str(env_id), list(ENV_REGISTRY), n=1, cutoff=0.6)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"textarena has no game {env_id!r}.{hint}")
    entry = spec.entry_point
    if isinstance(entry, str):
        import importlib

        module, _, name = entry.partition(":")
        entry = getattr(importlib.import_module(module), name)
    return entry(**spec.kwargs)


class TextArenaEnvironment(GameEnvironment):
    """Environment ``textarena`` (see the module docstring)."""

    def __init__(
        self,
        row: Mapping[str, Any],
        *,
        seed: int = 0,
        env_id: str = "",
        answer_tag: str | None = None,
        reward: str = "sum",
    ) -> None:
        super().__init__(row, seed=seed, answer_tag=answer_tag, reward=reward)
        self.env_id, self.name = env_id, f"textarena {env_id}"
        self.game: Any = None
        self.game_closed = False

    @classmethod
    def check_available(cls) -> None:
        require("textarena", "the textarena environment")

    @staticmethod
    def check_params(*, env_id: str = "", answer_tag: str | None = None, reward: str = "sum") -> None:
        """A ``ValueError`` naming an unknown game (with the nearest id), a bad tag or reward mode."""
        if not env_id:
            raise ValueError("environment 'textarena': give environment_kwargs.env_id, e.g. 'GuessTheNumber-v0'")
        require("textarena", f"the textarena environment ({env_id!r})")
        from textarena.envs.registration import ENV_REGISTRY

        if env_id not in ENV_REGISTRY:
            make_game(env_id)  # raises, naming the nearest id
        check_game_params(answer_tag, reward)

    def _start(self, seed: int, options: dict | None) -> str:
        self.game = make_game(self.env_id)
        self.game.reset(num_players=1, seed=seed)
        return self._messages()

    def _play(self, action: str) -> Played:
        answer = self.game.step(action)
        if not isinstance(answer, tuple) or len(answer) != 2 or not isinstance(answer[0], bool):
            raise TypeError(f"step returned {str(answer)[:60]!r}, not (done, info)")
        if not answer[0]:
            return Played(self._messages())
        rewards, info = self._close()
        if not isinstance(rewards, Mapping) or _PLAYER not in rewards:
            raise TypeError(f"the game ended without a reward for player 0 (close() gave {str(rewards)[:60]!r})")
        invalid = (info or {}).get(_PLAYER, {}).get("invalid_move") if isinstance(info, Mapping) else None
        return Played(None, rewards[_PLAYER], terminated=True, metrics={"game_invalid_move": float(bool(invalid))})

    def _messages(self) -> str:
        answer = self.game.get_observation()
        if not isinstance(answer, tuple) or len(answer) != 2 or not isinstance(answer[1], list):
            raise TypeError(f"get_observation returned {str(answer)[:60]!r}, not (player_id, messages)")
        player, messages = answer
        if player != _PLAYER:
            raise GameError(f"{self.name}: it is player {player}'s turn; only single-player games are supported")
        texts = []
        for message in messages:
            if not isinstance(message, tuple) or len(message) < 2 or not isinstance(message[1], str):
                raise TypeError(f"an observation message is {str(message)[:60]!r}, not (from_id, text, type)")
            if message[0] != _PLAYER:  # the policy's own action comes back as a message: it already holds it
                texts.append(message[1])
        return "\n".join(texts)

    def _close(self) -> tuple[Any, Any]:
        answer = self.game.close()
        self.game_closed = True
        return answer if isinstance(answer, tuple) and len(answer) == 2 else (answer, None)

    def _stop(self) -> None:
        if self.game is not None and not self.game_closed:
            self._close()


@hookimpl
def armor_register_environments(register: RegisterEnvironment) -> None:
    register("textarena", TextArenaEnvironment)
