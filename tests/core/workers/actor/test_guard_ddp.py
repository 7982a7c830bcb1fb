"""Guard decisions under data parallelism: a fault on one rank makes every rank act the same way.

A NaN that appears in one rank's gradients after DDP's all-reduce (a bad kernel, a bit flip) is
invisible to the other rank. If that rank skipped its optimizer step alone, the two replicas would
differ from then on, silently. The worker agrees on the gradient norm before the guards see it,
so both skip. The ``step`` stage (update_size) undoes a step on both ranks alike too.
"""

from __future__ import annotations

import pytest
import torch

from armor_core.testing import run_ranks

LENGTHS = [3, 1, 2, 3]
P, R = 3, 3


def make_config(strategy: str) -> dict:
    from armor_core.config.schema import load_config, to_dict

    rows = len(LENGTHS)
    return to_dict(
        load_config(
            None,
            [
                f"actor.strategy={strategy}",
                f"data.train_batch_size={rows}",
                f"actor.ppo_mini_batch_size={rows}",
                "rollout.n=1",
                f"rollout.max_new_tokens={R}",
                "actor.lr=1e-3",
                "engine.cpus_per_worker=1",
                "trainer.loggers=[]",
                # NaN in rank 1's gradients at step 2; x100 learning rate at step 3 (undone by update_size)
                "trainer.faults=[{kind: nan_grad, steps: [2], value: 1}, {kind: lr_scale, steps: [3], value: 100}]",
                "guard.guards=[{name: non_finite}, {name: update_size, params: {warmup: 1}}]",
            ],
        )
    )


def make_batch():
    from armor_core.dataproto.protocol import DataProto

    g = torch.Generator().manual_seed(0)
    n = len(LENGTHS)
    mask = (torch.arange(R).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(1)).long()
    responses = torch.randint(4, 19, (n, R), generator=g) * mask
    attention = torch.cat([torch.ones(n, P, dtype=torch.long), mask], dim=1)
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.cat([torch.randint(4, 19, (n, P), generator=g), responses], dim=1),
            "attention_mask": attention,
            "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
            "responses": responses,
            "response_mask": mask,
            "advantages": torch.randn(n, R, generator=g) * mask,
        }
    )


def _four_steps(rank: int, world: int) -> list[dict]:
    from armor_core.workers.actor.worker import ActorWorker
    from armor_core.workers.parallel.strategy import full_model_state

    mine = make_batch()[[rank, rank + 2]]
    w = ActorWorker(make_config("ddp"), rank=rank, world_size=world)
    out = []
    for step in (1, 2, 3, 4):
        m = w.update_actor(mine, step=step)
        out.append(
            {
                "skipped": m["actor/skipped_updates"],
                "grad_norm": m["actor/grad_norm"],
                "params": {k: v.clone() for k, v in full_model_state(w.model).items()},
            }
        )
    return out


@pytest.mark.slow
def test_a_fault_on_one_rank_is_skipped_by_every_rank(tmp_path):
    ranks = run_ranks(_four_steps, 2, tmp_path)
    # step 2: only rank 1 saw the NaN, both report it and both skip; step 3: both undo the x100 step
    assert [s["skipped"] for s in ranks[0]] == [s["skipped"] for s in ranks[1]] == [0.0, 1.0, 1.0, 0.0]
    assert all(torch.isnan(torch.tensor(r[1]["grad_norm"])) for r in ranks)
    for step in range(4):  # the replicas never part
        a, b = ranks[0][step]["params"], ranks[1][step]["params"]
        assert all(torch.equal(a[k], b[k]) for k in a), f"ranks differ after step {step + 1}"
    p1, p2, p3, p4 = (ranks[0][i]["params"] for i in range(4))
    assert all(torch.equal(p1[k], p2[k]) and torch.equal(p2[k], p3[k]) for k in p1)  # steps 2 and 3 left no trace
    assert any(not torch.equal(p3[k], p4[k]) for k in p3)  # and step 4 trained
