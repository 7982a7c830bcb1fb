"""`engine.address` joins an existing Ray cluster, and one worker group spans its nodes.

Two nodes on one machine: a head and a second raylet, each `ray start --block` in a session of its
own with 1 CPU, so a 2-worker actor group (1 CPU per worker) cannot fit on one node and PACK has
to spread it. `armor run` joins as a separate process; the ranks rendezvous at rank 0's node and
`isolation.json` records where each landed. The cluster gets its own temp dir and ports (the test
session's cluster keeps running) and is stopped by killing the two process groups this test
started (`ray stop` would stop every Ray process on the machine).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _node_ports(first_worker_port: int) -> list[str]:
    # every port a raylet opens, chosen here: two raylets on one machine must not both take the defaults
    a, b, c, d, e, f = _free_ports(6)
    return [
        "--disable-usage-stats",
        f"--dashboard-agent-listen-port={a}",
        f"--dashboard-agent-grpc-port={b}",
        f"--runtime-env-agent-port={c}",
        f"--metrics-export-port={d}",
        f"--node-manager-port={e}",
        f"--object-manager-port={f}",
        f"--min-worker-port={first_worker_port}",
        f"--max-worker-port={first_worker_port + 999}",
    ]


def _wait_for(log: Path, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and "block forever" in log.read_text():
            return
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(
        f"`ray start` did not come up within {timeout:.0f} s:\n{log.read_text()[-3000:] if log.exists() else ''}"
    )


@pytest.fixture
def two_node_cluster():
    temp = Path(tempfile.mkdtemp(prefix="/tmp/armor_mn_"))  # short: Ray's socket paths must fit in 107 characters
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    gcs_port, client_port = _free_ports(2)
    procs: list[subprocess.Popen] = []
    try:
        head_log = temp / "head.log"
        procs.append(
            subprocess.Popen(
                [
                    "ray",
                    "start",
                    "--head",
                    "--block",
                    f"--port={gcs_port}",
                    "--num-cpus=1",
                    '--resources={"node_head": 1}',
                    "--include-dashboard=false",
                    f"--temp-dir={temp}",
                    f"--ray-client-server-port={client_port}",
                    *_node_ports(30000),
                ],
                env=env,
                start_new_session=True,
                stdout=head_log.open("w"),
                stderr=subprocess.STDOUT,
            )
        )
        _wait_for(head_log, procs[0])
        b_log = temp / "node_b.log"
        procs.append(
            subprocess.Popen(
                [
                    "ray",
                    "start",
                    "--block",
                    f"--address=127.0.0.1:{gcs_port}",
                    "--num-cpus=1",
                    '--resources={"node_b": 1}',
                    *_node_ports(31000),
                ],
                env=env,
                start_new_session=True,
                stdout=b_log.open("w"),
                stderr=subprocess.STDOUT,
            )
        )
        _wait_for(b_log, procs[1])
        yield f"127.0.0.1:{gcs_port}", env
    finally:
        # SIGKILL to each whole session: `ray start --block`, the daemons and workers it started (SIGTERM
        # would drain the node for 30 s first); nothing in them needs a clean exit
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)
        for _ in range(20):  # killed daemons linger as zombies until init reaps them
            ps = subprocess.run(
                ["ps", "-o", "pid=,stat=", "-g", ",".join(str(p.pid) for p in procs) or "0"],
                capture_output=True,
                text=True,
            ).stdout
            left = [line.split()[0] for line in ps.splitlines() if not line.split()[1].startswith("Z")]
            if not left:
                break
            time.sleep(0.5)
        assert not left, f"processes of the test's Ray cluster still running: {left}"
        shutil.rmtree(temp, ignore_errors=True)


def test_a_worker_group_spans_two_nodes_of_a_joined_cluster(two_node_cluster, tmp_path, tiny_run):
    address, env = two_node_cluster
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "armor_core.cli.main",
        "run",
        f"engine.address={address}",
        *tiny_run,
        "actor.num_workers=2",
        "trainer.total_steps=2",
        f"trainer.run_dir={run_dir}",
    ]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    workers = {
        w["rank"]: w for w in json.loads((run_dir / "isolation.json").read_text())["workers"] if w["group"] == "actor"
    }
    assert sorted(workers) == [0, 1]
    assert workers[0]["node_id"] != workers[1]["node_id"], (
        workers
    )  # one rank on each raylet: the group spans the cluster
    assert all(w["isolated"] is False and "joined Ray cluster" in w["reason"] for w in workers.values())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2
    steps = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "actor/pg_loss" in line
    ]
    assert [s["step"] for s in steps] == [
        1,
        2,
    ]  # the two ranks trained together (their collectives met across the nodes)
