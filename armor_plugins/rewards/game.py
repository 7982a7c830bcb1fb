"""The ``game`` reward domain: a text game's own reward scores its episode; a game that failed fails its row.

Rows of the ``text_game`` task route here (``data_source: game``). The ``gym_text`` and ``textarena``
environments report each step's share of the episode's reward as the metric ``game_reward``
(``armor_plugins/environments/games.py``); the rollout sums an episode's metrics and the trainer hands them to
the reward domains with why the episode ended (``extra[EPISODE_KEY]``). The score is that sum, within
``score_range`` (``reward.domain_kwargs.game.score_range``, default ``[-1, 1]``, textarena's scale; a score
outside it fails the row).

An episode whose environment failed (it raised, answered with the wrong types, or ran past
``rollout.multi_turn.step_timeout_s``) fails its row here, with the game's own error in the message: the reward
manager scores it ``reward.failure_score``, counts it (``reward/failures``, ``reward/game/failures``), logs the
first of each kind, and stops the run when the game fails on more than ``reward.max_failure_fraction`` of its
rows (``reward.failure_window`` batches). Nothing of a failed episode's rewards is kept. A row scored without a
multi-turn episode (``rollout.multi_turn.enable=false``) fails too, saying so.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from armor_core import RewardDomain, hookimpl
from armor_core.hookspecs import RegisterRewardDomain
from armor_core.interfaces import EPISODE_KEY

__all__ = ["DATA_SOURCE", "GameFailedError", "game_reward"]

DATA_SOURCE = "game"
_FAILED = ("env_error", "env_timeout")


class GameFailedError(RuntimeError):
    """The row's game failed, or the row was played without a game."""


def game_reward(
    prompt: str,
    response: str,
    ground_truth: Any,
    extra: Mapping[str, Any] | None = None,
    *,
    score_range: tuple[float, float] = (-1.0, 1.0),
) -> float:
    """The episode's summed ``game_reward`` metric; ``GameFailedError`` (with the game's error) when it failed."""
    extra = extra or {}
    episode = extra.get(EPISODE_KEY)
    game = extra.get("game") or "the game"
    if not isinstance(episode, Mapping):
        raise GameFailedError(
            f"{game}: no episode to score; the game domain scores multi-turn rollouts (rollout.multi_turn.enable=true "
            "with environment gym_text or textarena)"
        )
    if episode.get("end") in _FAILED:
        raise GameFailedError(f"{game} failed ({episode.get('end')}): {episode.get('error') or 'no error given'}")
    metrics = episode.get("metrics") or {}
    value = float(metrics.get("game_reward", 0.0))
    if not math.isfinite(value):  # the rollout refuses non-finite metrics; a sum of finite ones can still overflow
        raise GameFailedError(f"{game}: the episode's reward is {value}")
    return value


def _score_range(params: Mapping[str, Any]) -> tuple[float, float]:
    low, high = params.get("score_range", (-1.0, 1.0))
    return float(low), float(high)


@hookimpl
def armor_register_reward_domains(register: RegisterRewardDomain) -> None:
    register(
        DATA_SOURCE,
        RewardDomain(game_reward, requires_ground_truth=False, inline=True, score_range=_score_range),
    )
