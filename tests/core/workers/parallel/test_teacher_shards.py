"""Under FSDP2 a teacher group of several ranks shards the teacher: a rank holds part of it, and what each rank
scores on its share of the rows (the sampled tokens' log-probs and the top-k) is what one unsharded teacher scores
on the same rows, with ranks that hold different numbers of micro-batches. One 2-process gloo group."""

from __future__ import annotations

import functools

import pytest
import torch
from test_parallel import make_batch, make_config, shares

pytestmark = pytest.mark.slow  # a process group of two ranks

TEACHER = {
    "algorithm.distill.teacher": "builtin:arithmetic-tiny",
    "algorithm.distill.mode": "topk_forward_kl",
    "algorithm.distill.k": "4",
    "algorithm.distill.micro_batch_size": "1",
}


def _case(rank: int, world: int) -> dict:
    from armor_core.workers.teacher import TeacherWorker

    batch = make_batch()
    mine = shares(batch, world)[rank]
    mine = mine if rank == 0 else mine[:2]  # rank 1 runs two micro-batches of one row, rank 0 four: stand-ins
    sharded = TeacherWorker(make_config("token-mean", "fsdp2", **TEACHER), rank=rank, world_size=world)
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in sharded.model.parameters())
    out = {"local": local, "whole": sum(p.numel() for p in sharded.model.parameters())}
    got = sharded.compute_teacher_log_prob(mine)
    one = TeacherWorker(make_config("token-mean", "fsdp2", **TEACHER), rank=0, world_size=1)
    want = one.compute_teacher_log_prob(mine)
    out["pairs"] = {k: (got[k], want[k]) for k in ("teacher_log_prob", "teacher_topk_log_probs", "teacher_topk_ids")}
    out["rows"] = len(mine)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from armor_core.testing import run_ranks

    out = tmp_path_factory.mktemp("teacher_shards")
    return run_ranks(functools.partial(_case), 2, out)


def test_a_sharded_teacher_scores_what_one_whole_teacher_scores(results):
    assert [r["rows"] for r in results] == [4, 2]
    for rank, r in enumerate(results):
        assert r["local"] < 0.75 * r["whole"], r  # this rank's part, not the whole teacher
        for key, (got, want) in r["pairs"].items():
            if key == "teacher_topk_ids":
                assert torch.equal(got, want), (rank, key)
            else:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=f"rank {rank}: {key}")
