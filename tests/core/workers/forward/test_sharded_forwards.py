"""Forwards without a backward under FSDP2 over two ranks: a sharded forward is a collective, so
ranks whose shares split into different numbers of micro-batches (token budgets) must still run as
many forwards as each other, and a layout is checked on a module whose forward is no collective.
The reference model is sharded like the policy. Log-probs (policy and reference) equal the
one-worker results on the same rows."""

from __future__ import annotations

import pytest
import torch

from armor_core.testing.batches import run_ranks

P, R = 4, 5
BUDGET = "11"  # rank 0's rows (9 tokens) one per micro-batch, rank 1's (5 tokens) two


def _config(strategy: str) -> dict:
    from armor_core.config.schema import load_config, to_dict

    return to_dict(
        load_config(
            None,
            [
                f"actor.strategy={strategy}",
                "data.train_batch_size=4",
                "actor.ppo_mini_batch_size=4",
                "rollout.n=1",
                f"rollout.max_new_tokens={R}",
                f"data.max_prompt_length={P}",
                f"actor.max_tokens_per_micro_batch={BUDGET}",
                "actor.use_kl_loss=true",
                "algorithm.adv_estimator=gae",
                "engine.cpus_per_worker=1",
                "trainer.loggers=[]",
            ],
        )
    )


def _batch(rank: int):
    from armor_core.dataproto.protocol import DataProto

    lengths = [5, 5, 5, 5] if rank == 0 else [1, 1, 1, 1]
    g = torch.Generator().manual_seed(rank)
    prompts = torch.randint(4, 19, (4, P), generator=g)
    resp_mask = (torch.arange(R).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long()
    responses = torch.randint(4, 19, (4, R), generator=g) * resp_mask
    attn = torch.cat([torch.ones(4, P, dtype=torch.long), resp_mask], 1)
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": attn,
            "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
            "responses": responses,
            "response_mask": resp_mask,
        }
    )


def _forwards(rank: int, world: int) -> dict:
    from armor_core.workers.actor.worker import ActorWorker
    from armor_core.workers.critic.worker import CriticWorker

    strategy = "fsdp2" if world > 1 else "ddp"
    actor, critic, data = (
        ActorWorker(_config(strategy), rank=rank, world_size=world),
        CriticWorker(_config(strategy), rank=rank, world_size=world),
        _batch(rank),
    )
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in actor.ref_model.parameters())
    return {
        "old": actor.compute_log_prob(data)["old_log_probs"],
        "ref": actor.compute_ref_log_prob(data)["ref_log_prob"],
        "values": critic.compute_values(data)["values"],
        "ref_elements": (local, sum(p.numel() for p in actor.ref_model.parameters())),
    }


@pytest.mark.slow
def test_sharded_forwards_match_across_unequal_micro_batch_counts(tmp_path):
    from armor_core.workers.common import micro_batches

    counts = [len(micro_batches(_batch(r)["attention_mask"].sum(-1), 64, int(BUDGET), "budget")) for r in (0, 1)]
    assert counts == [4, 2]  # without stand-ins rank 1 would stop after two forwards and rank 0 wait for it
    sharded = run_ranks(_forwards, 2, tmp_path)
    # the reference model is sharded like the policy: each rank holds about half of it
    total = sharded[0]["ref_elements"][1]
    assert (
        all(r["ref_elements"][0] < 0.6 * total for r in sharded) and sum(r["ref_elements"][0] for r in sharded) >= total
    )
    for rank, got in enumerate(sharded):
        from armor_core.workers.actor.worker import ActorWorker
        from armor_core.workers.critic.worker import CriticWorker

        data = _batch(rank)
        actor, critic = (
            ActorWorker(_config("ddp"), rank=0, world_size=1),
            CriticWorker(_config("ddp"), rank=0, world_size=1),
        )
        assert torch.allclose(got["old"], actor.compute_log_prob(data)["old_log_probs"], atol=1e-5)
        assert torch.allclose(got["ref"], actor.compute_ref_log_prob(data)["ref_log_prob"], atol=1e-5)
        # the value head starts at zero, so the values are 0 either way: what counts is that the
        # sharded pass returned at all (the ranks' forwards matched) with a row for each row
        assert got["values"].shape == critic.compute_values(data)["values"].shape == (4, R)
