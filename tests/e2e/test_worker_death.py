"""A worker that dies is noticed within seconds, named, and the run resumes from its last checkpoint.

The peers of a dead rank would wait in a collective for gloo's 30-minute timeout; the worker
group must notice the death itself. The whole-run test kills actor rank 1 (``kill_worker`` fault:
SIGKILL, as the OOM killer sends) in the middle of a 2-worker run, while rank 0 waits for it in
the update's first all-reduce.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from armor_core.config.schema import load_config
from armor_core.engine import WorkerDiedError, WorkerGroup
from armor_core.loop.trainer import Trainer

pytestmark = pytest.mark.slow  # see [tool.pytest.ini_options] markers


@pytest.fixture(params=[True, False], ids=["channel", "ray_calls"])
def channel(request):
    """Every group test runs with calls over the direct channel (the default) and through Ray's task path."""
    return request.param


def _group(ray_cluster, behaviour, channel=True):
    class Peer:
        def __init__(self, rank: int = 0, world_size: int = 1) -> None:
            self.rank = rank

        def ping(self) -> dict:
            return {"pid": os.getpid()}

        def step(self) -> int:
            behaviour(self.rank)
            return self.rank

        def step_if(self, value: int) -> int:
            return self.rank + value

        def run(self, fn):
            return fn(self.rank)

    return WorkerGroup(Peer, 2, cpus_per_worker=0.01, gpus_per_worker=0, name="peers", init_kwargs={}, channel=channel)


def test_a_killed_rank_stops_the_group_within_seconds_and_is_named(ray_cluster, channel):
    def _die_or_wait(rank: int) -> None:
        import signal

        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(600)  # rank 0: as if blocked in an all-reduce with rank 1

    group = _group(ray_cluster, _die_or_wait, channel)
    pid = group.placement[1]["pid"]
    t0 = time.monotonic()
    with pytest.raises(WorkerDiedError) as err:
        group.call(group.api.step)
    assert time.monotonic() - t0 < 10
    msg = str(err.value)
    assert f"worker group 'peers' rank 1 (pid {pid}, node " in msg and "died during step" in msg
    assert "its process vanished: killed by a signal (SIGKILL" in msg, msg  # Ray's cause, shortened
    assert group.workers == [] and group.pg is None  # rank 0 (stuck) was stopped too


def test_a_rank_that_raises_while_its_peers_wait_stops_the_group(ray_cluster, monkeypatch, channel):
    def _raise_or_wait(rank: int) -> None:
        if rank == 1:
            raise ValueError("bad shard")
        time.sleep(600)

    monkeypatch.setattr("armor_core.engine.group.FAILURE_GRACE_S", 1.0)
    group = _group(ray_cluster, _raise_or_wait, channel)
    t0 = time.monotonic()
    with pytest.raises(
        WorkerDiedError, match=r"rank 1 .* failed during step while ranks \[0\] waited on it.*ValueError: bad shard"
    ):
        group.call(group.api.step)
    assert time.monotonic() - t0 < 10


def test_a_rank_that_raises_alone_keeps_its_error(ray_cluster, channel):
    def _raise_alone(rank: int) -> None:
        if rank == 1:
            raise ValueError("bad shard")

    group = _group(ray_cluster, _raise_alone, channel)
    try:
        with pytest.raises(ValueError, match="bad shard") as err:
            group.call(group.api.step)
        if channel:  # raised as itself, with where it happened and the worker's traceback
            note = "\n".join(getattr(err.value, "__notes__", []))
            assert "raised in worker group 'peers' rank 1" in note and "during step" in note and "_raise_alone" in note
        assert group.call(group.api.ping)  # the group is still usable: nothing hung, nothing was stopped
        assert group.call(group.api.step_if, 0) == [0, 1]  # and the next call's replies are this call's
    finally:
        group.shutdown()


def test_functions_travel_and_a_reply_the_driver_cannot_read_is_an_error_not_a_hang(ray_cluster, channel):
    driver = os.getpid()

    def rebuild(value):
        if os.getpid() == driver:
            raise ImportError("no such class in the driver")
        return value

    class Unreadable:
        def __reduce__(self):
            return rebuild, (1,)

    group = _group(ray_cluster, lambda rank: None, channel)
    try:
        assert group.call(group.api.run, lambda rank: rank * 10) == [
            0,
            10,
        ]  # a local function, pickled by value as Ray does
        with pytest.raises(Exception, match="no such class in the driver"):
            group.call(group.api.run, lambda rank: Unreadable())
        assert group.call(group.api.run, lambda rank: rank + 1) == [1, 2]  # still in step: nothing hung
        lock = threading.Lock()
        with pytest.raises(TypeError, match="lock"):  # cannot be sent: no rank gets the call
            group.call(group.api.run, lambda rank: lock)
        assert group.call(group.api.run, lambda rank: rank + 2) == [2, 3]
    finally:
        group.shutdown()


def test_a_channel_the_driver_cannot_reach_is_a_clear_error(ray_cluster, monkeypatch):
    from armor_core.engine import ChannelError

    def refused(address, authkey):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr("armor_core.engine.channel.connect", refused)
    with pytest.raises(
        ChannelError,
        match=r"worker group 'peers' rank 0 .* listens at .*:\d+ for the driver's calls, but the driver could not "
        r"connect: "
        r".*Connection refused.*engine.direct_channel=false",
    ):
        _group(ray_cluster, lambda rank: None)


def test_killed_actor_worker_stops_the_run_and_resume_finishes_it(ray_cluster, tmp_path, tiny_run):
    # FSDP2 on two ranks: the checkpoints are sharded (actor.checkpoint_format=auto), each rank writing its own
    small = [*tiny_run, "trainer.total_steps=3", "trainer.save_freq=1", "actor.num_workers=2", "actor.strategy=fsdp2"]
    run_dir = tmp_path / "run"
    cfg = load_config(
        None, [*small, f"trainer.run_dir={run_dir}", "trainer.faults=[{kind: kill_worker, steps: [2], value: 1}]"]
    )
    trainer = Trainer(cfg)
    try:
        with pytest.raises(WorkerDiedError) as err:
            trainer.fit()
        t_error = time.time()
    finally:
        trainer.close()
    workers = {(w["group"], w["rank"]): w for w in json.loads((run_dir / "isolation.json").read_text())["workers"]}
    msg = str(err.value)
    assert msg.startswith(
        f"step 2: worker group 'actor' rank 1 (pid {workers['actor', 1]['pid']}, node {workers['actor', 1]['node_ip']} "
    )
    assert "died during update_actor: its process vanished: killed by a signal" in msg
    ckpt = run_dir / "checkpoints" / "step_000001"
    assert f"The last checkpoint, {ckpt}, is intact: run the same command with --resume" in msg
    assert (
        t_error - (ckpt / "trainer_state.json").stat().st_mtime < 20
    )  # step 2's generation, then the kill, then detection
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_000001"
    assert not list((run_dir / "checkpoints").glob("step_000002*"))

    # resumed with the shards written in the background: step 2's checkpoint is written while step 3 runs
    resumed = Trainer(load_config(None, [*small, f"trainer.run_dir={run_dir}", "trainer.async_save=true"]), resume=True)
    try:
        summary = resumed.fit()
    finally:
        resumed.close()
    assert summary["steps"] == 3 and summary["checkpoint"].endswith("step_000003")
    rows = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "actor/pg_loss" in line
    ]
    assert [r["step"] for r in rows] == [1, 2, 3]  # step 2 never logged before the kill; the resumed run did it
    assert "timing_s/save_wait" in rows[2] and "timing_s/save_wait" not in rows[1]  # step 3 made step 2's whole
    from armor_core.storage.checkpoint import check_intact

    check_intact(run_dir / "checkpoints" / "step_000002")  # its manifest covers every shard the thread wrote
    assert not list((run_dir / "checkpoints").glob("*.tmp"))
    last = Path(summary["checkpoint"])
    assert {"__0_0.distcp", "__1_0.distcp"} <= {p.name for p in (last / "actor_shards").iterdir()}
    assert not (last / "model").exists()
    from armor_core.cli.eval import check_model_files
    from armor_core.errors import UserFacingError

    with pytest.raises(UserFacingError, match=rf"{last} is a sharded checkpoint .*`armor export {last} OUT`"):
        check_model_files(str(last / "model"), trust_remote_code=False)  # `armor eval step_N/model` says what to do
    # what the user ships: a model directory assembled from the shards, which transformers loads
    from transformers import AutoModelForCausalLM

    from armor_core.cli.export import export

    export(last, tmp_path / "exported", merge=False)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "exported")
    assert torch.isfinite(model(torch.tensor([[5, 6, 7]])).logits).all()
