"""``armor run recipe:reasoning_gym``: a short run of the recipe (reasoning-gym's ``spell_backward`` on its warm start),
its rows scored in the reward pool by the dataset's own ``score_answer``, held-out accuracy before and after."""

from __future__ import annotations

import json

import pytest

from armor_core.cli.main import main

pytest.importorskip("reasoning_gym")

pytestmark = pytest.mark.slow

RUN = [
    "recipe:reasoning_gym",
    "trainer.total_steps=2",
    "data.train_size=32",
    "data.val_size=32",
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=4",
    "rollout.n=2",
    "trainer.loggers=[jsonl]",
    "engine.cpus_per_worker=1",
]


def test_a_short_run_on_a_reasoning_gym_dataset(ray_cluster, tmp_path):
    run_dir = tmp_path / "rg"
    assert main(["run", *RUN, f"trainer.run_dir={run_dir}"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    for when in ("val_before", "val_after"):
        assert 0.0 <= summary[when]["val/reasoning_gym/acc_greedy"] <= 1.0
    # the warm start spells some held-out words backward (0.41 of 200 when armor sft stopped), the base model none
    assert summary["val_before"]["val/reasoning_gym/acc_greedy"] >= 0.15
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    scored = [s for s in steps if "reward/reasoning_gym/score" in s]
    assert len(scored) >= 2 and all(s["reward/failures"] == 0.0 for s in scored)
