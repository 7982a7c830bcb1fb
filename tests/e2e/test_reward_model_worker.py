"""A reward model on a worker of its own (``reward.model[i].placement: worker``): the isolation plan counts it,
the run's rows are scored there (not in the reward pool), and a dead worker fails its rows with a clear error;
a local judge on a worker of its own says what it says in this process."""

from __future__ import annotations

import json
import os

import pytest

from armor_core.config.schema import load_config
from armor_core.engine.isolation import IsolationError, detect_available_cpus
from armor_core.loop.trainer import Trainer
from armor_core.workers.api import RewardModelAPI


def _tiny_classifier(out):
    """A one-output sequence classifier on the built-in tiny model's config and tokenizer (random weights)."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from armor_core.models.loading import load_tokenizer, resolve_model_path

    base = resolve_model_path("builtin:arithmetic-tiny")
    config = AutoConfig.from_pretrained(str(base), num_labels=1)
    torch.manual_seed(0)
    tokenizer = load_tokenizer("builtin:arithmetic-tiny")
    config.pad_token_id = tokenizer.pad_token_id
    AutoModelForSequenceClassification.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _config(tmp_path, rm, *overrides):
    small = ["data.train_size=32", "data.val_size=4", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4",
             "rollout.n=2", "rollout.max_new_tokens=4", "trainer.total_steps=2", "trainer.loggers=[jsonl]",
             "trainer.val_before_train=false", f"trainer.run_dir={tmp_path / 'run'}"]  # fmt: skip
    entry = f"reward.model=[{{path: {rm}, data_sources: [arithmetic], placement: worker, batch_size: 8}}]"
    return load_config(None, [entry, *small, *overrides])


def test_more_workers_than_cores_with_the_reward_model_is_one_error_at_start(tmp_path):
    rm = _tiny_classifier(tmp_path / "rm")
    cores = len(detect_available_cpus())
    with pytest.raises(IsolationError, match=r"2 workers \(actor: 1, reward_model:rm: 1\)"):
        Trainer(_config(tmp_path, rm, f"engine.cpus_per_worker={cores}"))


@pytest.mark.slow
def test_a_run_scores_its_rows_on_the_reward_model_worker(ray_cluster, tmp_path):
    import ray

    rm = _tiny_classifier(tmp_path / "rm")
    trainer = Trainer(_config(tmp_path, rm, "engine.cpus_per_worker=1"))
    try:
        trainer.fit()
        (group,) = trainer.reward_workers
        stats = group.call(RewardModelAPI.stats)[0]
        ray.kill(group.workers[0])
        dead = trainer.rewards.score(["1+1="], ["2"], ["arithmetic"], [None])
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:  # every row scored by the model, on the worker (its seconds logged), none failed
        assert r["reward/rm/failures"] == 0.0 and r["reward/rm/worker_s"] > 0.0
        assert "reward/arithmetic/score" not in r
    # 2 steps x 4 prompts x 2 samples, plus the 4 validation rows after training
    assert stats["rows"] >= 16 and stats["calls"] >= 2 and stats["device"] == "cpu" and stats["dtype"] == "float32"
    isolation = {w["group"]: w for w in json.loads((tmp_path / "run" / "isolation.json").read_text())["workers"]}
    assert set(isolation) == {"actor", "reward_model:rm"}
    worker, actor = isolation["reward_model:rm"], isolation["actor"]
    assert worker["pid"] == stats["pid"] != os.getpid() and worker["pid"] != actor["pid"]
    assert len(worker["cpus"]) == 1 and not set(worker["cpus"]) & set(actor["cpus"])  # a core of its own
    assert dead.metrics["reward/rm/failures"] == 1.0
    assert "reward_model:rm' rank 0" in dead.errors[0] and "is dead" in dead.errors[0]


@pytest.mark.slow
def test_a_local_judge_on_a_worker_of_its_own_gives_the_verdicts_it_gives_here(ray_cluster, tmp_path):
    from armor_core.config.schema import RewardConfig, to_dict
    from armor_core.plugins import PluginManager
    from armor_core.rewards.manager import RewardManager
    from armor_core.rewards.placement import worker_scorers
    from armor_core.workers.reward_model import WorkerClient, start_reward_workers

    entry = {"model": "builtin:arithmetic-tiny", "template": "{prompt}", "parser": "score", "placement": "worker",
             "score_range": [0, 10000], "max_new_tokens": 4, "data_sources": ["arith"]}  # fmt: skip
    prompts = ["12+30=", "7+8=", "40+41="]
    with RewardManager(RewardConfig(judge=entry), PluginManager()) as manager:
        here = manager.score(prompts, [""] * 3, ["arith"] * 3, [None] * 3)  # no worker started: in this process
        scorers = worker_scorers(manager.config_domains)
        assert list(scorers) == ["reward_model:judge"]
        config = to_dict(load_config(None, ["engine.cpus_per_worker=1"]))
        (group,) = start_reward_workers(scorers, {}, cpus=1, gpus=0, config=config, timeout_s=60)
        try:
            there = manager.score(prompts, [""] * 3, ["arith"] * 3, [None] * 3)
            stats = group.call(RewardModelAPI.stats)[0]
            scorers["reward_model:judge"].bind(WorkerClient(group, 1e-3))  # no forward pass answers that fast
            late = manager.score(prompts, [""] * 3, ["arith"] * 3, [None] * 3)
        finally:
            group.shutdown()
    assert there.scores.tolist() == here.scores.tolist() and there.metrics["reward/judge/failures"] == 0.0
    assert stats["rows"] == 3 and stats["calls"] == 1 and stats["pid"] != os.getpid()
    assert there.metrics["reward/judge/worker_s"] > 0.0 and "reward/judge/worker_s" not in here.metrics
    assert late.metrics["reward/judge/failures"] == 3.0
    assert "gave no scores for 3 rows within reward.timeout_s=0.001 s" in late.errors[0]
