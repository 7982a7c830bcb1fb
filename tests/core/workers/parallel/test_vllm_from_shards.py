"""Under FSDP2 an engine with weights of its own (``vllm``) is synced from the shards: no rank keeps a full copy of
the policy, and after an update the engine holds what the shards hold (its sums checked against the gathered
state; before the sync the same check finds it stale). One 2-process gloo group, an in-process vLLM engine each.
"""

from __future__ import annotations

import pytest
from test_parallel import full_state, make_batch, make_config, shares

pytest.importorskip("vllm")

pytestmark = pytest.mark.slow  # a process group of two ranks, each with a vLLM engine


def _case(rank: int, world: int) -> dict:
    from armor_core.models.weight_sums import SyncCheckError, check_sync
    from armor_core.workers.actor.worker import ActorWorker

    extra = {"rollout.backend": "vllm", "rollout.backend_kwargs.kv_cache_memory_bytes": "67108864"}
    w = ActorWorker(make_config("token-mean", "fsdp2", **extra), rank=rank, world_size=world)
    out: dict = {"no_copy": w.gen_model is w.model and not w.gen_copy, "needs_sync": w.needs_weight_sync()}
    w.update_actor(shares(make_batch(), world)[rank], step=1)
    state = full_state(w.model)  # a collective: every rank gathers
    try:
        check_sync(state, w.rollout.weight_sums, "test")
        out["stale_seen"] = False
    except SyncCheckError:
        out["stale_seen"] = True
    out["sync"] = w.sync_weights()  # a bucket at a time from the shards, checked (rollout.verify_sync)
    check_sync(state, w.rollout.weight_sums, "test")  # raises if the engine does not hold the new policy
    return out


def test_vllm_is_synced_from_the_shards_without_a_copy(tmp_path):
    from armor_core.testing import run_ranks

    results = run_ranks(_case, 2, tmp_path)
    for r in results:
        assert r["no_copy"] and r["needs_sync"]
        assert r["stale_seen"], "the engine matched the updated policy before any sync: the check shows nothing"
        assert r["sync"]["perf/verify_sync_s"] > 0 and r["sync"]["perf/sync_gb_per_s"] > 0
