"""``AsyncRollout.save`` / ``restore`` without Ray: the batches in flight go into a checkpoint and come
back as they were (rows, data positions, the rollout workers' RNG states); rows JSON cannot hold are
not saved (a warning; the resume regenerates); a checkpoint for another worker count is not used."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from armor_core.dataproto.protocol import DataProto
from armor_core.loop.async_rollout import QUEUE_DIR, AsyncRollout


class _Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class _Group:
    """A rollout group of ``n`` ranks: generate echoes the prompts with a version column; records RNG restores."""

    def __init__(self, n: int = 2) -> None:
        self.n, self.restored = n, {}

    def submit(self, method, data):
        return _Done(
            DataProto.from_dict(
                tensors={"responses": data["input_ids"] + 1, "policy_version": torch.zeros(len(data), dtype=torch.long)}
            )
        )

    def call(self, method):
        return [{"torch_rng": torch.full((4,), rank, dtype=torch.uint8)} for rank in range(self.n)]

    def call_rank(self, rank, method, state):
        self.restored[rank] = state


class _Loader:
    def __init__(self, extra=None) -> None:
        self.position, self.extra = 0, extra

    def next_batch(self):
        ids = torch.arange(self.position, self.position + 2).unsqueeze(1).repeat(1, 3)
        self.position += 2
        return DataProto.from_dict(
            tensors={
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "position_ids": torch.arange(3).repeat(2, 1),
            },
            non_tensors={"data_source": ["a", "b"], "extra": [self.extra, {"k": 1}]},
        )

    def next_samples(self, n):
        return self.next_batch().repeat(n, interleave=True)

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def _queue(extra=None, n=2):
    rollout = AsyncRollout(_Group(n), actor=None, loader=_Loader(extra), n=2, max_staleness=2)
    rollout.next(0)  # fills three batches, takes the first: two stay in flight
    return rollout


def test_the_batches_in_flight_come_back_as_they_were(tmp_path):
    saved = _queue({"answer": "4"})
    saved.save(tmp_path)
    restored = AsyncRollout(_Group(), actor=None, loader=_Loader(), n=2, max_staleness=2)
    assert restored.restore(tmp_path)
    assert (
        [i.loader_state for i in restored.queue]
        == [i.loader_state for i in saved.queue]
        == [{"position": 2}, {"position": 4}]
    )
    assert restored.loader.state_dict() == {"position": 6} and restored.loader_state() == {"position": 2}
    for a, b in zip(restored.queue, saved.queue):
        assert torch.equal(a.result()["responses"], b.result()["responses"]) and torch.equal(
            a.gen_in["input_ids"], b.gen_in["input_ids"]
        )
        assert a.gen_in["extra"].tolist() == b.gen_in["extra"].tolist()
    assert {r: s["torch_rng"].tolist() for r, s in restored.group.restored.items()} == {0: [0] * 4, 1: [1] * 4}
    gen_in, out = restored.next(
        2
    )  # the oldest saved batch, then the queue is topped up from the data position after them
    assert torch.equal(gen_in["input_ids"], saved.queue[0].gen_in["input_ids"]) and restored.loader.state_dict() == {
        "position": 8
    }


def test_rows_json_cannot_hold_are_not_saved_and_the_resume_regenerates(tmp_path):
    with pytest.warns(UserWarning, match="not saved with the checkpoint"):
        _queue(np.arange(3)).save(tmp_path)  # an array inside a row's extra (e.g. from Parquet)
    assert not (tmp_path / QUEUE_DIR).exists()
    assert not AsyncRollout(_Group(), actor=None, loader=_Loader(), n=2, max_staleness=2).restore(tmp_path)


def test_a_checkpoint_for_another_rollout_worker_count_is_not_used(tmp_path):
    _queue().save(tmp_path)
    other = AsyncRollout(_Group(3), actor=None, loader=_Loader(), n=2, max_staleness=2)
    assert not other.restore(tmp_path) and not other.queue and other.loader.state_dict() == {"position": 0}


def test_an_older_checkpoints_queue_pt_is_read_only_when_allowed(tmp_path):
    from armor_core.storage.state_io import StateFileError, load_state

    _queue().save(tmp_path)
    stem = tmp_path / QUEUE_DIR / "queue"
    torch.save(load_state(stem), stem.with_name("queue.pt"))  # as a checkpoint written before safetensors + JSON
    for ext in (".safetensors", ".json"):
        stem.with_name("queue" + ext).unlink()

    def fresh():
        return AsyncRollout(_Group(), actor=None, loader=_Loader(), n=2, max_staleness=2)

    with pytest.raises(StateFileError, match=r"queue\.pt is a torch \.pt state .*trainer\.allow_legacy_pt_state=true"):
        fresh().restore(tmp_path)
    restored = fresh()
    assert restored.restore(tmp_path, allow_legacy_pt=True)
    assert [i.loader_state for i in restored.queue] == [{"position": 2}, {"position": 4}]
