"""``rollout.mode=async``: a rollout worker of its own generates ahead while the actor trains.

One run covers the contract: every trained batch is exactly ``max_staleness`` updates old after the
first, the rollout log-probs differ from the trained policy's by as much (and the rollout
correction sees it), validation goes through the rollout worker with the newest weights, and a
checkpoint keeps the data position of the oldest batch in flight, so a resume regenerates the
queued batches instead of skipping their prompts.
"""

from __future__ import annotations

import json
import shutil

import pytest

from armor_core.config import load_config
from armor_core.trainer import Trainer

pytestmark = pytest.mark.slow

BASE = [
    "rollout.mode=async", "rollout.max_staleness=2", "algorithm.rollout_correction=tis_token",
    "data.train_size=256", "data.val_size=32", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=4",
    "rollout.max_new_tokens=6", "engine.cpus_per_worker=1", "trainer.loggers=[jsonl]", "trainer.save_freq=3",
]


def _run(run_dir, steps: int, resume: bool = False) -> list[dict]:
    trainer = Trainer(load_config(None, [*BASE, f"trainer.total_steps={steps}", f"trainer.run_dir={run_dir}"]), resume=resume)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_async_batches_are_max_staleness_old_and_resume_regenerates_the_queue(ray_cluster, tmp_path):
    rows = _run(tmp_path / "run", 5)
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5]
    # the first three batches were sent before any update; from then on each is max_staleness (2) old
    assert [r["rollout/staleness_max"] for r in steps] == [0, 1, 2, 2, 2]
    assert [r["rollout/policy_version"] for r in steps] == [0, 0, 0, 1, 2]
    for r in steps:
        assert r["timing_s/update_weights"] >= 0 and r["perf/rollout_worker_s"] > 0
        assert r["rollout_correction/weight_mean"] > 0
    # on policy at step 1 (the engine and the actor are the same weights, float32): no gap; stale afterwards
    assert steps[0]["rollout/logprob_diff_max"] < 1e-4 and steps[0]["rollout_correction/mismatch_kl"] < 1e-8
    assert all(r["rollout/logprob_diff_mean"] > 1e-4 for r in steps[2:])
    assert any("val/acc_greedy" in r for r in rows)  # validated through the rollout worker

    state = json.loads((tmp_path / "run" / "checkpoints" / "step_000003" / "trainer_state.json").read_text())
    # three batches trained (12 prompts); two more were in flight and are not counted as used
    assert state["loader"]["position"] == 3 * 4
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_000005")  # as if the run had died after step 3's checkpoint
    # the last two training rows: the resumed run's (metrics.jsonl keeps steps 1-3 of the first run)
    resumed = [r for r in _run(tmp_path / "run", 5, resume=True) if "actor/pg_loss" in r][-2:]
    # the queue is regenerated from the restored weights (version 3): the prompts of steps 4 and 5 are
    # the ones the first run trained on there, sampled again with fresher weights
    assert [r["step"] for r in resumed] == [4, 5]
    assert [r["rollout/policy_version"] for r in resumed] == [3, 3]
    assert [r["rollout/staleness_max"] for r in resumed] == [0, 1]


def test_async_with_lora_and_dynamic_sampling(ray_cluster, tmp_path):
    # the rollout worker holds a plain model: a LoRA actor sends its merged weights; dynamic sampling
    # takes further batches from the queue, so a step trains on rows of mixed age, all within the bound
    trainer = Trainer(load_config(None, [*BASE, "rollout.max_staleness=1", "model.lora_rank=8", "model.lora_alpha=16", "actor.lr=5e-4",
                                         "algorithm.filter_groups=true", "trainer.total_steps=3", "trainer.save_freq=0",
                                         f"trainer.run_dir={tmp_path / 'run'}"]))
    try:
        trainer.fit()
    finally:
        trainer.close()
    steps = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) if "actor/pg_loss" in r]
    assert len(steps) == 3 and all(r["dynamic_sampling/groups_kept"] == 4 for r in steps)
    assert all(r["rollout/staleness_max"] <= 1 for r in steps) and steps[0]["rollout/staleness_max"] == 0
    # the first step's rows come from the weights being trained (LoRA's B starts at 0: the base model)
    assert steps[0]["rollout/logprob_diff_max"] < 1e-4
    assert any(r["rollout/staleness_max"] == 1 and r["rollout/logprob_diff_mean"] > 1e-4 for r in steps[1:])
