"""DataProto through a Ray actor and back: what a worker group does with every batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from armor_core import DataProto

pytestmark = pytest.mark.slow  # see [tool.pytest.ini_options] markers


def test_round_trip_through_an_actor_that_modifies_the_batch(ray_cluster):
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class Worker:
        def process(self, data: DataProto) -> DataProto:
            # writing into a received tensor must be safe (Ray hands out read-only shared memory)
            data["log_probs"] += 1.0
            data["values"] = data["log_probs"] * 2
            data["answers"] = np.array([p.upper() for p in data["prompt"]], dtype=object)
            data.meta_info["metrics"] = {"rows": len(data), "device": str(data["input_ids"].device)}
            return data

    data = DataProto.from_dict(
        tensors={
            "input_ids": torch.arange(8 * 64).reshape(8, 64),  # > 100 KB with the others: goes through the object store
            "log_probs": torch.full((8, 4096), -0.5),
            "mask": torch.arange(8) % 2 == 0,
        },
        non_tensors={"prompt": np.array([f"q{i}" for i in range(8)], dtype=object)},
        meta_info={"temperature": 0.7},
    )
    worker = Worker.remote()
    out = ray.get(worker.process.remote(data[2:6]))  # a slice: only its rows should travel

    assert isinstance(out, DataProto) and len(out) == 4
    assert out.keys() == ["input_ids", "log_probs", "mask", "values", "prompt", "answers"]
    assert out["input_ids"][:, 0].tolist() == [128, 192, 256, 320]
    assert out["mask"].tolist() == [True, False, True, False]
    assert torch.all(out["log_probs"] == 0.5) and torch.all(out["values"] == 1.0)
    assert out["answers"].tolist() == ["Q2", "Q3", "Q4", "Q5"]
    assert out.meta_info == {"temperature": 0.7, "metrics": {"rows": 4, "device": "cpu"}}
    assert torch.all(data["log_probs"] == -0.5)  # the driver's batch is untouched
    out["values"] += 1  # and what comes back is writable too


@pytest.mark.parametrize("channel", [True, False], ids=["channel", "ray_calls"])
def test_a_group_splits_two_batches_on_their_own_and_merges_each_back_in_order(ray_cluster, channel):
    """``WorkerGroup.submit_pair``: what one update-then-generate call does with two ranks. Each
    batch is split by its own token counts, each rank returns (metrics, rows), and the pair comes
    back as one metrics dict (``merge_metrics``: max for seconds, mean otherwise) and one batch in
    the original row order."""
    import os

    from armor_core.engine import WorkerGroup

    class Peer:
        def __init__(self, rank: int = 0, world_size: int = 1) -> None:
            self.rank = rank

        def ping(self) -> dict:
            return {"pid": os.getpid()}

        def pair(self, first: DataProto, second: DataProto, step: int, scale: float = 1.0) -> tuple[dict, DataProto]:
            second["seen_by"] = torch.full((len(second),), self.rank)
            second["doubled"] = second["input_ids"] * 2 * scale
            return {
                "rows": float(len(first)),
                "step": float(step),
                "first_tokens": float(first["response_mask"].sum()),
                "perf/worker_s": 1.0 + self.rank,
            }, second

    group = WorkerGroup(Peer, 2, cpus_per_worker=0.01, gpus_per_worker=0, name="peers", init_kwargs={}, channel=channel)
    try:
        first = DataProto.from_dict(
            tensors={"response_mask": (torch.arange(6)[None, :] < torch.tensor([6, 1, 5, 2, 4, 3])[:, None]).long()}
        )
        second = DataProto.from_dict(
            tensors={
                "input_ids": torch.arange(8)[:, None].repeat(1, 3),
                "attention_mask": torch.ones(8, 3, dtype=torch.long),
            }
        )
        earlier = group.submit_pair(Peer.pair, first, second, 6)
        metrics, out = group.submit_pair(Peer.pair, first, second, 7, scale=0.5).result()
        assert earlier.result()[0]["step"] == 6.0  # gathered after a later call: its replies were kept
        assert (len(group.conns) == 2) == channel
        for conn in group.conns:  # a one-machine cluster: the workers listen on loopback only
            import socket

            with socket.socket(fileno=os.dup(conn.fileno())) as sock:
                assert sock.getpeername()[0] == "127.0.0.1"
    finally:
        group.shutdown()
    # 21 tokens split 10/11 or 11/10, averaged; the slowest rank's seconds
    assert metrics == {"rows": 3.0, "step": 7.0, "first_tokens": 10.5, "perf/worker_s": 2.0}
    with pytest.raises(TypeError, match=r"'pair' is not a method of Peer; name a worker method by reference"):
        group.submit_pair("pair", first, second, 7)
    assert torch.equal(out["input_ids"], second["input_ids"]) and torch.equal(
        out["doubled"], second["input_ids"].float()
    )
    assert sorted(out["seen_by"].tolist()) == [0, 0, 0, 0, 1, 1, 1, 1]
    out["doubled"] += 1  # what comes back is writable
