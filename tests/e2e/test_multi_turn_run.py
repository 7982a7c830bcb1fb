"""A whole run with multi-turn rollouts through Ray, sync and async: the rows' columns reach the environments in
the actor workers or the rollout worker, the reward domains score the episodes' final turns, and every step logs its own episodes'
``env/...`` metrics (also the steps whose rollout the previous update call generated)."""

from __future__ import annotations

import json

import pytest

from armor_core.config.schema import load_config
from armor_core.loop.trainer import Trainer

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    "mode",
    [[], ["rollout.mode=async", "rollout.max_staleness=1", "algorithm.rollout_correction=tis_token"]],
    ids=["sync", "async"],
)
def test_a_multi_turn_run_trains_and_logs_its_episodes(ray_cluster, tmp_path, mode):
    cfg = load_config(
        None,
        [
            "data.train_size=64",
            "data.val_size=8",
            "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=4",
            "rollout.n=4",
            "rollout.max_new_tokens=4",
            "trainer.total_steps=3",
            "trainer.loggers=[jsonl]",
            "engine.cpus_per_worker=1",
            "rollout.multi_turn.enable=true",
            "rollout.multi_turn.environment_kwargs={tools: ['armor_plugins.environments.builtin_tools:calculator']}",
            f"trainer.run_dir={tmp_path / 'run'}",
            *mode,
        ],
    )
    trainer = Trainer(cfg)
    try:
        trainer.fit()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:  # the tiny model calls no tool: one turn, ended by the environment, nothing masked
        assert r["env/turns"] == 1.0 and r["env/ended_done"] == 1.0 and r["env/masked_share"] == 0.0
        assert 0.0 <= r["critic/score/mean"] <= 1.0
