"""FSDP2 on a mixture-of-experts policy (the DeepSeek-V3-architecture warm start ``moe-tiny``): two ranks holding
shards take the step one whole worker takes, with routing replay's recorded experts and without, and report the
experts' load. One 2-process gloo group."""

from __future__ import annotations

import functools

import pytest
import torch
from test_parallel import full_state, make_batch, make_config, shares

from armor_core.models.routing_replay import ROUTES

pytestmark = pytest.mark.slow  # a process group of two ranks

MOE = {"model.path": "builtin:moe-tiny"}


def _with_routes(batch):
    """Recorded routes for every position: two distinct experts of 4 per token, in each of the 3 MoE layers."""
    n, T = batch["input_ids"].shape
    g = torch.Generator().manual_seed(1)
    first = torch.randint(0, 4, (n, T, 3, 1), generator=g)
    second = (first + torch.randint(1, 4, (n, T, 3, 1), generator=g)) % 4
    batch[ROUTES] = torch.cat([first, second], -1).to(torch.int16)
    return batch


def _case(rank: int, world: int) -> dict:
    from armor_core.workers.actor.worker import ActorWorker

    out: dict = {}
    for name, batch in (("replayed", _with_routes(make_batch())), ("own", make_batch())):
        sharded = ActorWorker(make_config("token-mean", "fsdp2", **MOE), rank=rank, world_size=world)
        local = sum(p.to_local().numel() for p in sharded.model.parameters())
        metrics = sharded.update_actor(shares(batch, world)[rank], step=1)
        out[name] = {"params": full_state(sharded.model), "metrics": metrics, "local": local}
        if rank == 0:
            one = ActorWorker(make_config("token-mean", "ddp", **MOE), rank=0, world_size=1)
            out[name]["init"] = full_state(one.model)
            one.update_actor(batch, step=1)
            out[name]["want"] = full_state(one.model)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from armor_core.testing import run_ranks

    return run_ranks(functools.partial(_case), 2, tmp_path_factory.mktemp("moe_shards"))


def test_two_sharded_ranks_take_one_workers_step_on_an_moe_model(results):
    for name in ("replayed", "own"):
        want, init = results[0][name]["want"], results[0][name]["init"]
        assert any(".mlp.experts." in k for k in want) and any(".mlp.gate." in k for k in want)
        whole = sum(v.numel() for v in want.values())
        for rank in range(2):
            got = results[rank][name]
            assert got["local"] < 0.75 * whole, "each rank holds a part of the model"
            # Adam moves a weight whose gradient is float noise by up to lr (1e-3) in a noise direction (see
            # test_parallel): tight nearly everywhere, lr / 10 everywhere
            for k, v in want.items():
                diff = (got["params"][k] - v).abs()
                assert diff.max() < 1e-4 and (diff > 2e-6).double().mean() < 1e-3, (name, rank, k, float(diff.max()))
            assert 1 <= got["metrics"]["moe/load_max"] <= 4 and 0 < got["metrics"]["moe/load_entropy"] <= 1
        moved = [k for k in want if not torch.allclose(want[k], init[k])]
        assert any(".mlp.gate." in k for k in moved) and any(".mlp.experts." in k for k in moved)
    # the recorded routes were used: the same batch routed by the model itself takes another step
    replayed, own = results[0]["replayed"]["want"], results[0]["own"]["want"]
    assert any(not torch.allclose(replayed[k], own[k], atol=1e-6) for k in replayed if ".mlp.experts." in k)
