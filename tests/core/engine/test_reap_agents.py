"""Ray agent processes left by a local cluster killed with its driver are stopped at the next local start;
the agents of a live cluster (children of a raylet) are left alone."""

import subprocess
import time

import psutil

from armor_core.engine.cluster import reap_orphaned_agents


def _agents() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[0] == "ray::DashboardAgent"]


def test_orphaned_agents_are_stopped_and_a_live_clusters_are_not():
    existing = {p.pid for p in _agents()}  # a real cluster's agents (another test's): never touched here
    ours = lambda: [p for p in _agents() if p.pid not in existing]  # noqa: E731
    # an orphan: started by a shell that exits at once, so the "agent" is re-parented as after a kill -9
    subprocess.run(["bash", "-c", "(exec -a ray::DashboardAgent sleep 120 &)"], check=True)
    # a live cluster's agent: its parent is a process called raylet
    live = subprocess.Popen(["bash", "-c", "exec -a raylet bash -c '(exec -a ray::DashboardAgent sleep 120) & wait'"])
    try:
        deadline = time.time() + 5
        while len(ours()) < 2 and time.time() < deadline:
            time.sleep(0.05)
        before = ours()
        orphans = [p for p in before if "raylet" not in " ".join(p.parent().cmdline()[:1])]
        assert len(before) >= 2 and len(orphans) >= 1
        assert reap_orphaned_agents() >= len(orphans)  # and any left by an earlier killed run
        left = ours()
        assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in orphans)
        assert any(p.parent() and p.parent().pid == live.pid for p in left)  # the live cluster's agent runs on
    finally:
        for p in ours():
            p.kill()
        live.kill()
