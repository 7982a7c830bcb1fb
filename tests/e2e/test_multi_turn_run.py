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


def _metrics(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "actor/pg_loss" in r}


def test_a_multi_turn_run_with_lora_and_dynamic_sampling_resumes_exactly(ray_cluster, tmp_path):
    # with environments, LoRA and dynamic sampling together: killed after step 2 and resumed, step 3 is the
    # step an uninterrupted run takes, bit for bit (the environment is deterministic)
    settings = [
        "data.train_size=64",
        "data.val_size=8",
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=4",
        "rollout.n=4",
        "rollout.max_new_tokens=8",
        "trainer.loggers=[jsonl]",
        "trainer.save_freq=1",
        "trainer.val_freq=0",
        "engine.cpus_per_worker=1",
        "model.lora_rank=4",
        "actor.lr=2e-3",
        "algorithm.filter_groups=true",
        "algorithm.max_gen_batches=4",
        "rollout.multi_turn.enable=true",
        "rollout.multi_turn.environment_kwargs={tools: ['armor_plugins.environments.builtin_tools:calculator']}",
    ]

    def fit(name, steps, resume=False):
        trainer = Trainer(
            load_config(None, [*settings, f"trainer.total_steps={steps}", f"trainer.run_dir={tmp_path / name}"]),
            resume=resume,
        )
        try:
            trainer.fit()
        finally:
            trainer.close()
        return _metrics(tmp_path / name)

    whole = fit("whole", 3)
    fit("cut", 2)
    resumed = fit("cut", 3, resume=True)
    assert sorted(resumed) == [1, 2, 3]
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "env/turns"):
        assert resumed[3][key] == whole[3][key], key
    adapter = "checkpoints/step_000003/adapter/adapter_model.safetensors"
    assert (tmp_path / "cut" / adapter).read_bytes() == (tmp_path / "whole" / adapter).read_bytes()
