"""The ``gym_text`` environment on a tiny deterministic game with gymnasium's API, written here: observations become
user turns, the answer tag's text is the action, step rewards are summed (or the last kept), ARMOR's turn limit
ends the episode, and a game that raises, hangs or answers with the wrong types fails its row by name."""

from __future__ import annotations

import logging
import sys
import time

import pytest

from armor_core.interfaces import AssistantTurn
from armor_core.rewards.checks import RewardFailureError
from armor_plugins.environments.games import GameError, parse_action
from armor_plugins.environments.gym_text import GymTextEnvironment, load_factory
from armor_plugins.tasks.text_game import generate_text_game


class Counting:
    """Say the numbers up from ``seed % 7``: a right number scores 1 and a wrong one -0.5; three right ones end the
    game (terminated). ``options["behaviour"]`` makes it misbehave on its first step."""

    def __init__(self, right_to_win=3):
        self.right_to_win = right_to_win

    def reset(self, *, seed=None, options=None):
        self.next, self.right = seed % 7, 0
        self.behaviour = (options or {}).get("behaviour", "plays")
        return f"say {self.next}", {}

    def step(self, action):
        if self.behaviour == "raises":
            raise ValueError("the board is on fire")
        if self.behaviour == "hangs":
            time.sleep(3)
        if self.behaviour == "wrong_reward":
            return "say 1", "1", False, False, {}
        if self.behaviour == "three_values":
            return "say 1", 1.0, False
        right = action == str(self.next)
        self.right += right
        self.next += right
        return f"say {self.next}", 1.0 if right else -0.5, self.right >= self.right_to_win, False, {}


def make_counting(right_to_win=3):
    return Counting(right_to_win)


def _env(seed=3, **kwargs):
    return GymTextEnvironment({"extra": {"game_seed": seed}}, factory=make_counting, **kwargs)


def _turn(text, index=0):
    return AssistantTurn(text, (), index)


def test_observations_are_user_turns_and_the_answer_tag_is_the_action():
    env = _env(answer_tag="answer")
    assert env.first_observation() == "say 3"
    step = env.step(_turn("I think <answer>9</answer> no, <answer> 3 </answer>"))  # the last tag, stripped
    assert (step.observation, step.done, step.metrics["game_reward"]) == ("say 4", False, 1.0)
    step = env.step(_turn("4", 1))  # no tag: the whole turn is played, and counted
    assert step.metrics["game_untagged"] == 1.0 and step.metrics["game_reward"] == 1.0
    assert parse_action(" x ", None) == ("x", True)


@pytest.mark.parametrize(
    "mode, shares, total", [("sum", [-0.5, 1.0, 1.0, 1.0], 2.5), ("last", [-0.5, 1.5, 0.0, 0.0], 1.0)]
)
def test_the_episode_reward_is_the_sum_or_the_last_step_reward(mode, shares, total):
    env = _env(reward=mode)
    env.reset()
    steps = [env.step(_turn(a, i)) for i, a in enumerate(["0", "3", "4", "5"])]
    assert [s.metrics["game_reward"] for s in steps] == shares and sum(shares) == total
    assert steps[-1].done and steps[-1].observation is None and steps[-1].metrics["game_terminated"] == 1.0


def test_a_game_that_raises_or_answers_wrong_types_is_a_game_error_naming_it():
    for behaviour, expected in [
        ("raises", "step raised ValueError: the board is on fire"),
        ("wrong_reward", "step returned the wrong type: the step's reward is '1' (str)"),
        ("three_values", "step raised TypeError: step returned a tuple"),
    ]:
        env = GymTextEnvironment(
            {"extra": {"game_seed": 1, "game_options": {"behaviour": behaviour}}}, factory=make_counting
        )
        env.reset()
        with pytest.raises(GameError, match="gym_text make_counting") as e:
            env.step(_turn("1"))
        assert expected in str(e.value)


def test_bad_parameters_are_named_at_start(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="has no 'make_countin'. Did you mean 'make_counting'"):
        GymTextEnvironment.check_params(factory=f"{__name__}:make_countin")
    with pytest.raises(ValueError, match="reward='mean' must be one of sum, last"):
        GymTextEnvironment.check_params(factory=make_counting, reward="mean")
    (tmp_path / "my_maze.py").write_text("import gymnasium\n\ndef make():\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "gymnasium", None)  # as if it were not installed
    with pytest.raises(ValueError, match="gymnasium.*pip install 'armor-rl\\[games\\]'"):
        load_factory("my_maze:make")
    assert load_factory(make_counting) is make_counting


def test_the_turn_limit_ends_an_episode_and_observations_are_masked(play_games, chat_tokenizer):
    rows = generate_text_game("train", 2, 0, factory=make_counting, kwargs={"right_to_win": 99})
    assert all(r["prompt"][0]["content"] == f"say {r['extra_info']['game_seed'] % 7}" for r in rows)
    out = play_games(rows, GymTextEnvironment, max_turns=3, max_response_tokens=200,
                     environment_kwargs={"factory": make_counting, "kwargs": {"right_to_win": 99}})  # fmt: skip
    assert out.meta_info["metrics"]["env/ended_max_turns"] == 1.0
    for row, episode in enumerate(out.non_tensors["episode"]):
        roles = [t["role"] for t in episode["turns"]]
        assert roles == ["assistant", "user", "assistant", "user", "assistant"]
        assert episode["metrics"]["game_steps"] == 3.0  # the game answered every turn, the last one included
        for t in episode["turns"]:  # the game's tokens are in no loss; every sampled token is
            mask = out["response_mask"][row, t["start"] : t["end"]].tolist()
            assert mask == [int(t["role"] == "assistant")] * len(mask)
            if t["role"] == "user":
                assert "say " in chat_tokenizer.decode(out["responses"][row, t["start"] : t["end"]])


def test_a_failing_game_fails_its_row_by_name_and_the_run_goes_on_within_the_fraction(play_games, score_games, caplog):
    behaviours = ["plays", "raises", "hangs", "wrong_reward"]
    rows = [
        {**row, "extra_info": {**row["extra_info"], "game_options": {"behaviour": b}}}
        for row, b in zip(generate_text_game("test", 4, 0, factory=make_counting), behaviours)
    ]
    start = time.perf_counter()
    out = play_games(rows, GymTextEnvironment, max_turns=2, max_response_tokens=100, step_timeout_s=0.5,
                     environment_kwargs={"factory": make_counting})  # fmt: skip
    assert time.perf_counter() - start < 2.5  # the hung game (3 s) is abandoned at the step timeout
    assert [e["end"] for e in out.non_tensors["episode"]][1:] == ["env_error", "env_timeout", "env_error"]
    with caplog.at_level(logging.ERROR):
        scores, metrics = score_games(out, max_failure_fraction=1.0)
    assert metrics["reward/game/failures"] == 3.0 and metrics["reward/failures"] == 3.0
    assert scores[1:].tolist() == [0.0, 0.0, 0.0]  # reward.failure_score, nothing of the game's partial rewards
    assert "gym_text make_counting: step raised ValueError: the board is on fire" in caplog.text
    with pytest.raises(RewardFailureError, match="reward domain 'game' failed on 3 of its 4 rows"):
        score_games(out, max_failure_fraction=0.5)
