"""The StabilityGuard in a real run: injected NaN gradients and an Inf reward are skipped with the
guard on and kill the run with it off; workers are isolated and say so in isolation.json."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from armor_core.config.schema import load_config
from armor_core.loop.trainer import Trainer

pytestmark = pytest.mark.slow

FAULTS = "trainer.faults=[{kind: nan_grad, steps: [2]}, {kind: inf_reward, steps: [3]}]"
SMALL = [
    "data.train_size=256",
    "data.val_size=16",
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=4",
    "rollout.n=4",
    "rollout.max_new_tokens=4",
    "trainer.total_steps=4",
    "trainer.val_freq=0",
    "trainer.loggers=[jsonl]",
    "engine.cpus_per_worker=1",
    FAULTS,
]


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

    # the same faults unguarded: the NaN gradient reaches the weights and the next rollout stops on it, in one line
    from armor_core.errors import NonFiniteError

    with pytest.raises(
        # step 2's update made the weights NaN, and the next rollout is sampled within step 2 (overlapped with it)
        NonFiniteError,
        match=r"^step 2: the policy's next-token distribution holds NaN or inf .*guard.enable=true",
    ):
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


def test_update_size_undoes_a_huge_step_and_lowers_a_learning_rate_that_is_too_high(ray_cluster, tmp_path):
    """lr 10x too high from the start, and x100 more at step 3: the ceiling lowers the rate, the spike is undone."""
    faults = "trainer.faults=[{kind: lr_scale, steps: [3], value: 100}]"
    guards = "guard.guards=[{name: non_finite}, {name: update_size, params: {max_ratio: 2e-3, warmup: 1}}]"
    assert run(tmp_path, "us", faults, guards, "actor.lr=5e-4", "trainer.save_freq=1", "trainer.keep_checkpoints=4")
    events = [json.loads(x) for x in (tmp_path / "us" / "guard_events.jsonl").read_text().splitlines()]
    by_step = {e["step"]: e for e in events if e["guard"] == "update_size"}
    lowered = by_step[1]["adjustments"]["lr"]
    assert by_step[1]["signal"] > 2e-3 and lowered < 5e-4
    assert by_step[3]["action"] == "skip"
    rows = [json.loads(x) for x in (tmp_path / "us" / "metrics.jsonl").read_text().splitlines()]
    lr = {r["step"]: r["actor/lr"] for r in rows if "actor/lr" in r}
    # actor/lr is the rate each update used: the cut made after step 1's optimizer step is step 2's rate
    assert lr[1] == pytest.approx(5e-4) and lr[2] == pytest.approx(lowered) and lr[4] <= lowered
    assert lr[3] == pytest.approx(100 * lr[4])  # the x100 fault shows in the rate step 3 used, then is undone
    ratio = {r["step"]: r["actor/update_ratio"] for r in rows if "actor/update_ratio" in r}
    assert ratio[3] > 10 * ratio[2]  # the x100 step was measured ...
    ckpt = tmp_path / "us" / "checkpoints"
    w2, w3 = (load_file(str(ckpt / f"step_00000{s}" / "model" / "model.safetensors")) for s in (2, 3))
    assert all(torch.equal(w2[k], w3[k]) for k in w2)  # ... and undone: step 3 left the weights as step 2 made them


def test_two_ranks_record_each_worker_side_verdict_once(ray_cluster, tmp_path):
    # the grad-stage verdict is taken on every rank (collectively); only rank 0 writes it down
    assert run(
        tmp_path, "dp", "trainer.faults=[{kind: nan_grad, steps: [2]}]", "actor.num_workers=2", "trainer.total_steps=3"
    )
    events = [json.loads(x) for x in (tmp_path / "dp" / "guard_events.jsonl").read_text().splitlines()]
    keys = [(e["step"], e["stage"], e["guard"]) for e in events]
    assert (2, "grad", "non_finite") in keys and len(keys) == len(set(keys))


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_a_rollback_without_checkpoints_restores_a_rollback_point_and_keeps_the_rate_it_lowered(
    ray_cluster, tmp_path, capsys, store
):
    """save_freq=0: no checkpoint before the end. Flipped rewards at steps 1-3 and 5 (the score is high), the true
    ones at step 4 (it collapses): the guard rolls back to the point kept before step 3, the suspected update, and
    halves the learning rate, which step 5 then trains with."""
    from armor_core.storage.checkpoint import CheckpointManager
    from armor_core.workers.api import ActorAPI

    run_dir = tmp_path / store
    cfg = load_config(
        None,
        [
            *SMALL,
            f"trainer.run_dir={run_dir}",
            "trainer.total_steps=5",
            "trainer.faults=[{kind: flip_reward, steps: [1, 2, 3, 5]}]",
            "guard.guards=[{name: reward_collapse, params: {warmup: 2, window: 2, patience: 1, z: 0, "
            "rollback_lr_factor: 0.5}}]",
            "guard.rollback_every=2",
            f"guard.rollback_store={store}",
        ],
    )
    trainer = Trainer(cfg)
    rows = []
    try:
        for step in range(1, 6):
            rows.append(trainer.train_step())
            if step in (2, 3, 4):  # the weights as each step left them
                (tmp_path / f"w{step}").mkdir()
                trainer.actor.call(ActorAPI.save_checkpoint, str(tmp_path / f"w{step}"))
    finally:
        trainer.close()
    out = capsys.readouterr().out
    assert f"rollback points: {'in memory' if store == 'memory' else 'on disk'}" in out
    assert f"step 4: rolled back to the rollback point of step 2 ({store})" in out
    w2, w3, w4 = (load_file(str(tmp_path / f"w{s}" / "model" / "model.safetensors")) for s in (2, 3, 4))
    assert any(not torch.equal(w2[k], w3[k]) for k in w2)  # step 3 trained ...
    assert all(torch.equal(w2[k], w4[k]) for k in w2)  # ... and the rollback put the point of step 2 back exactly
    lr = [r.get("actor/lr") for r in rows]
    assert [r.get("guard/rollback") for r in rows] == [None, None, None, 1.0, None]
    assert lr[:3] == [pytest.approx(5e-5)] * 3 and lr[3] is None and lr[4] == pytest.approx(2.5e-5)
    assert rows[3]["guard/adjust/lr"] == pytest.approx(2.5e-5)  # logged at the step it came with the rollback
    kept = [r["timing_s/rollback_point"] > 0 for r in rows]
    assert kept == [True, False, True, False, True]  # points of steps 0, 2 and 4
    # nothing --resume would take for a checkpoint: there is none, whatever the rollback store holds
    assert CheckpointManager(run_dir).latest() is None
    held = sorted(p.name for p in (run_dir / "rollback").glob("step_*")) if store == "disk" else []
    assert held == (["step_000002", "step_000004"] if store == "disk" else [])


def test_the_default_trust_region_undoes_a_far_step_and_a_resume_after_it_continues_bit_for_bit(ray_cluster, tmp_path):
    """Nothing about the guard set, the learning rate 100x the recipe's: the first step is undone and the rate lowered;
    a run killed after the guard changed the rate resumes exactly as it went on (rate, guard state, weights)."""
    high = ["actor.lr=5e-3", "trainer.faults=[]", "trainer.save_freq=2", "trainer.total_steps=4"]
    assert run(tmp_path, "tr", *high)
    events = [json.loads(x) for x in (tmp_path / "tr" / "guard_events.jsonl").read_text().splitlines()]
    first = events[0]
    assert (first["step"], first["stage"], first["guard"], first["action"]) == (1, "step", "trust_region", "skip")
    assert first["signal"] > 4 * 0.05 and first["adjustments"]["lr"] < 5e-3
    rows = [json.loads(x) for x in (tmp_path / "tr" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert steps[0]["actor/skipped_updates"] == 1.0 and steps[1]["actor/lr"] == pytest.approx(
        first["adjustments"]["lr"]
    )

    ckpts = tmp_path / "tr" / "checkpoints"
    final = load_file(str(ckpts / "step_000004" / "model" / "model.safetensors"))
    shutil.rmtree(ckpts / "step_000004")  # as if the run had been killed after step 3
    (ckpts / "latest").write_text("step_000002")
    trainer = Trainer(load_config(None, [*SMALL, f"trainer.run_dir={tmp_path / 'tr'}", *high]), resume=True)
    try:
        trainer.fit()
    finally:
        trainer.close()
    again = [json.loads(x) for x in (tmp_path / "tr" / "metrics.jsonl").read_text().splitlines()]
    resumed = [r for r in again if "actor/pg_loss" in r][-2:]
    clock = ("timing_s/", "perf/")
    same = lambda r: {k: v for k, v in r.items() if not k.startswith(clock)}  # noqa: E731
    assert [r["step"] for r in resumed] == [3, 4] and [same(r) for r in resumed] == [same(r) for r in steps[2:]]
    after = load_file(str(ckpts / "step_000004" / "model" / "model.safetensors"))
    assert all(torch.equal(after[k], final[k]) for k in final)
    # the events of the steps taken again are dropped on resume and written again: the same decisions, once each
    assert [json.loads(x) for x in (tmp_path / "tr" / "guard_events.jsonl").read_text().splitlines()] == events


def test_a_weight_sync_the_engine_did_not_take_stops_the_run_and_is_a_guard_event(ray_cluster, tmp_path, tiny_run):
    # FSDP2 with a full copy to generate from (an engine with weights of its own); step 2's sync drops a tensor
    from armor_core.models.weight_sums import SyncCheckError

    run_dir = tmp_path / "run"
    cfg = load_config(
        None,
        [
            *tiny_run,
            "trainer.total_steps=3",
            "actor.num_workers=2",
            "actor.strategy=fsdp2",
            "actor.fsdp_generation=copy",
            f"trainer.run_dir={run_dir}",
            "trainer.faults=[{kind: lost_sync, steps: [2]}]",
        ],
    )
    trainer = Trainer(cfg)
    try:
        with pytest.raises(
            SyncCheckError, match=r"weight sync actor rank \d -> hf failed: .*model\.embed_tokens\.weight"
        ):
            trainer.fit()
    finally:
        trainer.close()
    events = [json.loads(line) for line in (run_dir / "guard_events.jsonl").read_text().splitlines()]
    stops = [e for e in events if e["action"] == "stop"]
    assert len(stops) == 1 and stops[0]["guard"] == "weight_sync" and stops[0]["step"] == 2, events
    assert "model.embed_tokens.weight" in stops[0]["reason"]
