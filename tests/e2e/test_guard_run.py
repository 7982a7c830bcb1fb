"""The StabilityGuard in a real run: injected NaN gradients and an Inf reward are skipped with the
guard on and kill the run with it off; workers are isolated and say so in isolation.json."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from armor_core.config import load_config
from armor_core.trainer import Trainer

pytestmark = pytest.mark.slow

FAULTS = "trainer.faults=[{kind: nan_grad, steps: [2]}, {kind: inf_reward, steps: [3]}]"
SMALL = ["data.train_size=256", "data.val_size=16", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=4",
         "rollout.max_new_tokens=4", "trainer.total_steps=4", "trainer.val_freq=0", "trainer.loggers=[jsonl]", "engine.cpus_per_worker=1", FAULTS]


def run(tmp_path, name, *overrides):
    trainer = Trainer(load_config(None, [*SMALL, f"trainer.run_dir={tmp_path / name}", *overrides]))
    try:
        trainer.fit()
    finally:
        trainer.close()
    latest = (tmp_path / name / "checkpoints" / "latest").read_text().strip()
    weights = load_file(str(tmp_path / name / "checkpoints" / latest / "model" / "model.safetensors"))
    return all(torch.isfinite(w).all() for w in weights.values())


def test_guard_skips_injected_faults_and_keeps_weights_finite(ray_cluster, tmp_path):
    assert run(tmp_path, "on")
    events = [json.loads(x) for x in (tmp_path / "on" / "guard_events.jsonl").read_text().splitlines()]
    acted = {(e["step"], e["stage"], e["action"]) for e in events}
    assert (2, "grad", "skip") in acted and (3, "reward", "skip") in acted
    iso = json.loads((tmp_path / "on" / "isolation.json").read_text())
    assert [(w["group"], w["rank"], w["threads"]) for w in iso["workers"]] == [("actor", 0, 1)]

    # the same faults unguarded: the NaN gradient reaches the weights and the next rollout dies on it
    with pytest.raises(Exception, match="inf.*nan|nan.*inf"):
        run(tmp_path, "off", "guard.enable=false")


def test_repeated_faults_roll_back_and_the_run_goes_on(ray_cluster, tmp_path):
    faults = "trainer.faults=[{kind: nan_grad, steps: [3, 4]}]"
    guards = "guard.guards=[{name: non_finite, params: {max_consecutive: 2}}]"
    assert run(tmp_path, "rb", faults, guards, "trainer.save_freq=1", "trainer.total_steps=5")
    events = [json.loads(x) for x in (tmp_path / "rb" / "guard_events.jsonl").read_text().splitlines()]
    assert any(e["action"] == "rollback" and e["step"] == 4 for e in events)
    rows = [json.loads(x) for x in (tmp_path / "rb" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "critic/score/mean" in r]
    assert steps == [1, 2, 3, 4, 5]  # the clock does not rewind: the offending batches are skipped
    assert any(r.get("guard/rollback") == 1.0 for r in rows)
