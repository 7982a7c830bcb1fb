"""The ``textarena`` environment and the ``text_game`` task against the real textarena (0.7.x): a game played to a
win by scripted actions, the single-player games that work offline, the game's tokens masked in the rollout's
batch, a game that answers with a text reward failing its row, and a missing textarena as one line."""

from __future__ import annotations

import re
import sys

import pytest

from armor_core import Task
from armor_core.interfaces import AssistantTurn
from armor_core.testing.checks import check_task
from armor_core.testing.environments import check_environment
from armor_plugins.environments.games import GameError, GamesMissingError
from armor_plugins.environments.textarena_games import TextArenaEnvironment
from armor_plugins.rewards.game import game_reward
from armor_plugins.tasks.text_game import game_seeds, generate_text_game

pytest.importorskip("textarena")

#: single-player games that start and take a move with no download (the docs list them)
OFFLINE = [
    "GuessTheNumber-v0",
    "TowerOfHanoi-v0",
    "Minesweeper-v0-small",
    "FifteenPuzzle-v0",
    "Sudoku-v0-very-easy",
    "LightsOut-v0",
    "FrozenLake-v0",
    "Mastermind-v0",
    "PegJump-v0",
    "Bandit-v0",
    "Blackjack-v0",
]


def _env(row, env_id="GuessTheNumber-v0", **kwargs):
    return TextArenaEnvironment({"extra": row["extra_info"]}, env_id=env_id, **kwargs)


def test_a_scripted_player_wins_guess_the_number_by_bisection():
    row = generate_text_game("train", 1, 7, env_id="GuessTheNumber-v0")[0]
    assert "Guess The Number" in row["prompt"][0]["content"] and row["data_source"] == "game"
    env = _env(row, answer_tag="answer")
    env.reset()
    low, high, turns = 1, 20, []
    for index in range(10):
        guess = (low + high) // 2
        step = env.step(AssistantTurn(f"thinking... <answer>[{guess}]</answer>", (), index))
        turns.append(step)
        if step.done:
            break
        assert "[" not in step.observation  # the policy's own action is not echoed back
        low, high = (guess + 1, high) if "higher" in step.observation else (low, guess - 1)
    env.close()
    assert turns[-1].done and turns[-1].metrics["game_terminated"] == 1.0
    assert sum(t.metrics["game_reward"] for t in turns) == 1.0  # textarena's win
    assert turns[-1].metrics["game_invalid_move"] == 0.0 and len(turns) <= 5


@pytest.mark.parametrize("env_id", OFFLINE)
def test_the_offline_games_start_and_answer_a_move(env_id):
    rows = generate_text_game("test", 2, 1, env_id=env_id)
    assert all(r["prompt"][0]["content"].strip() for r in rows)  # the game's first observation is the prompt
    env = _env(rows[0], env_id)
    env.reset()
    step = env.step(AssistantTurn("[1]", (), 0))  # usually an invalid move: the game says so, or ends
    assert step.done or isinstance(step.observation, str)
    env.close()


def test_the_task_and_the_environment_pass_the_plugin_authors_checks():
    rows = check_task(Task(generate_text_game), size=4, env_id="GuessTheNumber-v0")  # a prompt shared, no game
    row = {**rows[0], "extra": rows[0]["extra_info"]}
    steps = check_environment(TextArenaEnvironment, row, env_id="GuessTheNumber-v0")
    assert all(s.done or isinstance(s.observation, str) for s in steps)


def test_the_same_seed_gives_the_same_game_and_the_splits_share_no_seed():
    a = generate_text_game("train", 3, 5, env_id="Minesweeper-v0-small")
    b = generate_text_game("train", 3, 5, env_id="Minesweeper-v0-small")
    assert a == b
    train, test = set(game_seeds("train", 500, 5)), set(game_seeds("test", 500, 5))
    assert len(train) == len(test) == 500 and not train & test


@pytest.mark.parametrize("env_id", ["Countdown-v0", "Cryptarithm-v0"])
def test_a_game_answering_with_the_wrong_types_is_an_error_naming_it(env_id):
    row = generate_text_game("train", 1, 0, env_id=env_id)[0]
    env = _env(row, env_id)
    env.reset()
    # textarena 0.7.4's Countdown and Cryptarithm echo the move with their arguments swapped: the message is not text
    with pytest.raises(GameError, match=f"textarena {env_id}: step raised TypeError: an observation message is"):
        env.step(AssistantTurn("[1]", (), 0))


def test_the_game_tokens_are_masked_in_the_training_batch(play_games, chat_tokenizer, score_games):
    rows = generate_text_game("train", 2, 3, env_id="GuessTheNumber-v0")
    out = play_games(rows, TextArenaEnvironment, n=2, max_new_tokens=3, max_turns=3, max_response_tokens=400,
                     environment_kwargs={"env_id": "GuessTheNumber-v0"})  # fmt: skip
    mask, responses = out["response_mask"], out["responses"]
    observed = 0
    for row, episode in enumerate(out.non_tensors["episode"]):
        roles = [t["role"] for t in episode["turns"]]  # two invalid moves (the random policy's) end the game
        assert roles[::2] == ["assistant"] * len(roles[::2]) and set(roles[1::2]) == {"user"}
        covered = 0
        for t in episode["turns"]:
            span = mask[row, t["start"] : t["end"]].tolist()
            if t["role"] == "user":  # the game's answer: read by the policy, in no loss
                text = chat_tokenizer.decode(responses[row, t["start"] : t["end"]])
                assert span == [0] * len(span) and "You attempted an invalid move" in text
                assert out["attention_mask"][row, -responses.shape[1] + t["start"]].item() == 1
                observed += len(span)
            else:
                assert span == [1] * len(span)
            covered += t["end"] - t["start"]
        assert mask[row, covered:].sum() == 0  # padding too
    assert observed > 0 and out.meta_info["metrics"]["env/masked_share"] > 0.5
    scores, metrics = score_games(out)
    assert metrics["reward/failures"] == 0.0 and scores.shape == (4,)


def test_a_missing_textarena_is_one_line_naming_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "textarena", None)
    with pytest.raises(GamesMissingError, match=re.escape("pip install 'armor-rl[games]'")) as e:
        TextArenaEnvironment.check_available()
    assert "\n" not in str(e.value)
    with pytest.raises(GamesMissingError, match=re.escape("pip install 'armor-rl[games]'")):
        generate_text_game("train", 1, 0, env_id="GuessTheNumber-v0")  # the task, in the driver


def test_an_unknown_game_is_named_with_the_nearest_id():
    with pytest.raises(ValueError, match="textarena has no game 'GuessTheNumbr-v0'. Did you mean 'GuessTheNumber-v0'"):
        TextArenaEnvironment.check_params(env_id="GuessTheNumbr-v0")


def test_the_game_domain_scores_the_summed_reward_and_fails_a_failed_episode():
    episode = {"end": "done", "error": None, "metrics": {"game_reward": 0.75, "game_steps": 3.0}}
    assert game_reward("p", "r", None, {"_armor_episode": episode}) == 0.75
    failed = {"end": "env_timeout", "error": "no answer within 5 s", "metrics": {}}
    with pytest.raises(RuntimeError, match="textarena Sudoku-v0 failed \\(env_timeout\\): no answer within 5 s"):
        game_reward("p", "r", None, {"_armor_episode": failed, "game": "textarena Sudoku-v0"})
    with pytest.raises(RuntimeError, match="rollout.multi_turn.enable=true"):
        game_reward("p", "r", None, {})
