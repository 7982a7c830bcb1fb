"""DataProto through a Ray actor and back: what a worker group does with every batch."""

from __future__ import annotations

import numpy as np
import torch

from armor_core import DataProto


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
