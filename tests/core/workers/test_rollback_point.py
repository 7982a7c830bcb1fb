"""Rollback points in a worker's memory: restoring one gives back exactly the weights, optimizer state, schedule
position and RNG of the moment it was kept, on one rank and on each of two (DDP, FSDP2: its own shards only),
while the learning rate a guard set since stays in force."""

from __future__ import annotations

import pytest
import torch

from armor_core.testing import run_ranks

OVERRIDES = [
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=4",
    "rollout.n=1",
    "rollout.max_new_tokens=3",
    "data.max_prompt_length=4",
    "actor.lr=1e-3",
    "actor.warmup_steps=5",  # a schedule whose position matters: the rate grows with every step
    "engine.cpus_per_worker=1",
    "trainer.loggers=[]",
    "guard.enable=false",  # the rate changes here are the tests' own
]


def _config(*overrides: str) -> dict:
    from armor_core.config.schema import load_config, to_dict

    return to_dict(load_config(None, [*OVERRIDES, *overrides]))


def _batch():
    from armor_core.dataproto.protocol import DataProto
    from armor_core.testing.batches import rollout_batch

    ids, attn, pos, responses = rollout_batch([4, 3, 2, 4], [3, 2, 3, 1], P=4, R=3, vocab=19)
    mask = attn[:, 4:].clone()
    g = torch.Generator().manual_seed(1)
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": pos,
            "responses": responses,
            "response_mask": mask,
            "advantages": torch.randn(4, 3, generator=g) * mask,
        }
    )


def _local(t: torch.Tensor) -> torch.Tensor:
    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()


def _state(w) -> dict:
    """What a point must give back: this rank's trained weights and optimizer state, schedule, RNG, update count."""
    params = [p for g in w.optimizer.param_groups for p in g["params"]]
    return {
        "weights": [_local(p) for p in params],
        "optimizer": [
            {k: _local(v) for k, v in w.optimizer.state[p].items()} for p in params if p in w.optimizer.state
        ],
        "last_epoch": w.scheduler.last_epoch if hasattr(w, "scheduler") else None,
        "rng": torch.get_rng_state(),
        "global_step": getattr(w, "global_step", None),
    }


def _same(a: dict, b: dict) -> bool:
    def equal(x, y):
        if isinstance(x, torch.Tensor):
            return torch.equal(x, y)
        if isinstance(x, (list, tuple)):
            return len(x) == len(y) and all(equal(i, j) for i, j in zip(x, y))
        if isinstance(x, dict):
            return x.keys() == y.keys() and all(equal(x[k], y[k]) for k in x)
        return x == y

    return equal(a, b)


def test_an_actor_point_gives_back_its_moment_exactly_and_keeps_the_rate_a_guard_set_since(one_thread):
    from armor_core.workers.actor.worker import ActorWorker

    w, batch = ActorWorker(_config(), rank=0, world_size=1), _batch()
    w.update_actor(batch, step=1)
    w.keep_rollback_point(1, [])
    kept = _state(w)
    assert w.points.points[1].nbytes == w.rollback_point_bytes()  # the size announced at start is what is held
    torch.rand(5)  # the generator moves on
    for step in (2, 3):
        w.update_actor(batch, step=step)
    w.apply_adjustments({"lr": 1e-5})  # a guard lowered the rate after the point was kept
    assert not _same(_state(w), kept)

    w.restore_rollback_point(1)
    assert _same(_state(w), kept)
    # the schedule is back at step 1's position, at the rate the guard set, not at the one kept with the point
    factor = w.scheduler.lr_lambdas[0](w.scheduler.last_epoch)
    assert factor < 1 and w.scheduler.base_lrs == [1e-5]
    assert w.optimizer.param_groups[0]["lr"] == pytest.approx(1e-5 * factor)

    w.update_actor(batch, step=4)  # training on from a restored point leaves the point as it was
    w.restore_rollback_point(1)
    assert _same(_state(w), kept)


def test_a_point_kept_before_the_first_step_restores_a_fresh_start(one_thread):
    """No optimizer state yet: the restore drops the state training made, and the next update is a first one."""
    from armor_core.workers.actor.worker import ActorWorker

    w, batch = ActorWorker(_config(), rank=0, world_size=1), _batch()
    w.keep_rollback_point(0, [])
    w.update_actor(batch, step=1)
    w.keep_rollback_point(1, [0])
    w.update_actor(batch, step=2)
    w.restore_rollback_point(0)
    assert not w.optimizer.state and w.scheduler.last_epoch == 0 and w.global_step == 0
    w.update_actor(batch, step=1)

    fresh = ActorWorker(_config(), rank=0, world_size=1)
    fresh.update_actor(batch, step=1)
    assert _same(_state(w)["weights"], _state(fresh)["weights"])
    assert _same(_state(w)["optimizer"], _state(fresh)["optimizer"])
    w.keep_rollback_point(5, [0])  # only the points the driver still counts on stay
    assert sorted(w.points.points) == [0, 5]
    with pytest.raises(RuntimeError, match=r"no rollback point of step 1 is kept in this worker \(kept: \[0, 5\]\)"):
        w.restore_rollback_point(1)


def test_a_critic_point_gives_back_its_weights_and_optimizer_state(one_thread):
    from armor_core.workers.critic.worker import CriticWorker

    batch = _batch()
    batch.tensors.update({"values": torch.zeros(4, 3), "returns": torch.rand(4, 3) * batch["response_mask"]})
    c = CriticWorker(_config("algorithm.adv_estimator=gae"), rank=0, world_size=1)
    c.update_critic(batch, step=1)
    c.keep_rollback_point(1, [])
    kept = _state(c)
    c.update_critic(batch, step=2)
    assert not _same(_state(c)["weights"], kept["weights"])
    c.restore_rollback_point(1)
    assert _same({**_state(c), "rng": None}, {**kept, "rng": None})


def _two_ranks(rank: int, world: int, strategy: str) -> dict:
    from armor_core.workers.actor.worker import ActorWorker

    w = ActorWorker(_config(f"actor.strategy={strategy}"), rank=rank, world_size=world)
    mine = _batch()[[rank, rank + 2]]
    w.update_actor(mine, step=1)
    w.keep_rollback_point(1, [])
    kept = _state(w)
    w.update_actor(mine, step=2)
    moved = not _same(_state(w)["weights"], kept["weights"])
    w.restore_rollback_point(1)
    full = sum(p.numel() * p.element_size() for g in w.optimizer.param_groups for p in g["params"])
    return {"restored": _same(_state(w), kept), "moved": moved, "bytes": w.points.points[1].nbytes, "full": 3 * full}


def _ddp(rank: int, world: int) -> dict:
    return _two_ranks(rank, world, "ddp")


def _fsdp2(rank: int, world: int) -> dict:
    return _two_ranks(rank, world, "fsdp2")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_each_of_two_ranks_restores_its_own_state_and_under_fsdp2_holds_only_its_shards(tmp_path, strategy):
    ranks = run_ranks(_ddp if strategy == "ddp" else _fsdp2, 2, tmp_path)
    assert all(r["moved"] and r["restored"] for r in ranks), ranks
    if strategy == "ddp":  # every rank holds the whole model and optimizer (and Adam's step counters)
        assert all(r["full"] <= r["bytes"] < 1.01 * r["full"] for r in ranks), ranks
    else:  # each rank copied its shards: about half, never a gathered whole
        assert all(r["bytes"] < 0.6 * r["full"] for r in ranks), ranks
