"""A short training run on a textarena game: ``data.task=text_game`` makes the rows, the ``textarena`` environment
plays them in the actor workers, the ``game`` domain scores the episodes with the game's reward, and every step
logs the game's metrics and the masked share of the episodes' tokens."""

from __future__ import annotations

import json

import pytest

from armor_core.config.schema import load_config
from armor_core.loop.trainer import Trainer

pytestmark = pytest.mark.slow
pytest.importorskip("textarena")

GAME = "{env_id: GuessTheNumber-v0}"


def test_a_textarena_game_trains_end_to_end(ray_cluster, tmp_path, tiny_run):
    cfg = load_config(
        None,
        [
            *tiny_run,
            "model.path=builtin:tools-tiny",  # a chat template, and every printable character a token
            "data.task=text_game",
            f"data.task_kwargs={GAME}",
            "data.train_size=8",
            "data.max_prompt_length=600",  # textarena's rules are the first user turn (~530 tokens)
            "rollout.max_new_tokens=6",
            "rollout.multi_turn.enable=true",
            "rollout.multi_turn.environment=textarena",
            f"rollout.multi_turn.environment_kwargs={GAME}",
            "rollout.multi_turn.max_turns=3",
            "rollout.multi_turn.max_response_tokens=160",
            "rollout.multi_turn.max_observation_tokens=96",
            "trainer.total_steps=2",
            f"trainer.run_dir={tmp_path / 'run'}",
        ],
    )
    trainer = Trainer(cfg)
    try:
        trainer.fit()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:  # every episode played the game: it answered each turn, its tokens masked, nothing failed
        assert r["env/game_steps"] >= 1.0 and r["env/masked_share"] > 0.0
        assert r["reward/failures"] == 0.0 and r["env/ended_env_error"] == 0.0
        assert -1.0 <= r["critic/score/mean"] <= 1.0
