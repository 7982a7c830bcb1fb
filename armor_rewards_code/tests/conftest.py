"""Shared fixtures of the code pack's tests: each way the sandbox confines a run (``mode``), the live
processes of the sandbox's users, and a fresh domain sandbox per test."""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest

from armor_rewards_code import domain, sandbox, tool


def modes(granted: sandbox.Confinement) -> dict[str, tuple[bool, sandbox.Confinement]]:
    """Each way the sandbox confines a run: (whether this kernel grants what it needs now, the confinement)."""
    return {
        "namespaces": (granted.namespaces, granted),
        "seccomp and landlock": (
            granted.network and granted.files,
            dataclasses.replace(granted, namespaces=False),  # a kernel that refuses the namespaces
        ),
        "unconfined": (True, sandbox.Confinement(False, False, False, why="refused")),  # one that refuses all three
    }


MODES = list(modes(sandbox.Confinement(True, True, True)))


@pytest.fixture(autouse=True)
def _fresh_sandboxes():
    """The domain and the tool keep their sandboxes; a test that confines them its own way leaves none behind."""
    domain._sandbox.cache_clear()
    tool._sandbox.cache_clear()
    yield
    domain._sandbox.cache_clear()
    tool._sandbox.cache_clear()


def _confine(monkeypatch: pytest.MonkeyPatch, confinement: sandbox.Confinement) -> None:
    monkeypatch.setattr(sandbox, "probe_confinement", lambda: confinement)
    domain._sandbox.cache_clear()
    tool._sandbox.cache_clear()


@pytest.fixture
def confine(monkeypatch):
    """``confine(confinement)``: the sandboxes made from now on confine their runs as ``confinement`` says."""
    return lambda confinement: _confine(monkeypatch, confinement)


@pytest.fixture(params=MODES)
def mode(request, monkeypatch) -> str:
    now = sandbox.probe_confinement()  # probed when the test runs: a long process may lose what it had at start
    granted, confinement = modes(now)[request.param]
    if not granted:
        pytest.skip(f"this kernel refuses what {request.param} needs: {now.why}")
    _confine(monkeypatch, confinement)
    return request.param


class Processes:
    """What the host's /proc shows of a test's programs."""

    @staticmethod
    def leftover() -> list[str]:
        """Live processes of the sandbox's users (fresh uids from 1,000,000 when run as root); a killed orphan
        is a zombie until this machine's init reaps it, and holds nothing."""
        found = []
        for entry in Path("/proc").iterdir():
            try:
                status = (entry / "status").read_text()
                uid = int(status.split("\nUid:")[1].split()[0])
            except (OSError, IndexError, ValueError):
                continue
            if uid >= 1_000_000 and "\nState:\tZ" not in status:
                found.append(entry.name)
        return found

    @staticmethod
    def marked(marker: str) -> list[int]:
        """Live (not zombie) processes with ``marker`` on their command line."""
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if (
                    marker.encode() in (entry / "cmdline").read_bytes()
                    and "\nState:\tZ" not in (entry / "status").read_text()
                ):
                    found.append(int(entry.name))
            except (OSError, ValueError):
                continue
        return found

    @staticmethod
    def children(parent: int) -> list[int]:
        """The live processes whose parent is ``parent``."""
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if int((entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[1]) == parent:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
        return found

    @staticmethod
    def describe(pids: list[int]) -> str:
        """What each of ``pids`` is doing (state, parent, signals blocked and pending, where it sleeps), and the
        machine's load: for a failing test's message."""
        keys = ("Name", "State", "PPid", "Uid", "SigPnd", "ShdPnd", "SigBlk", "SigCgt")
        lines = [f"load: {Path('/proc/loadavg').read_text().strip()}"]
        for pid in pids:
            try:
                status = dict(
                    line.split(":\t", 1)
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if ":\t" in line
                )
                wchan = Path(f"/proc/{pid}/wchan").read_text()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120].decode(errors="replace")
            except OSError as e:
                lines.append(f"{pid}: gone ({e.strerror})")
                continue
            fields = ", ".join(f"{k} {status.get(k, '?').strip()}" for k in keys)
            lines.append(f"{pid}: {fields}, wchan {wchan or '-'}, cmdline {cmdline!r}")
        return "\n".join(lines)

    def gone(self, marker: str, within_s: float = 2.0) -> list[int]:
        """Wait up to ``within_s`` for the processes marked ``marker`` to end (SIGKILL is sent, init reaps a
        moment later); those still alive then are returned, and killed, so a failing test leaves none behind."""
        deadline = time.monotonic() + within_s
        while self.marked(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = self.marked(marker)
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return alive


@pytest.fixture
def processes() -> Processes:
    return Processes()


@pytest.fixture
def as_nobody():
    """``as_nobody(fn)``: ``fn()`` run in a child as uid 65534, an ordinary user; returns the text it returned."""
    if os.geteuid() != 0:
        pytest.skip("needs root to become an ordinary user")

    def run(fn) -> str:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(read)
                os.setgroups([])
                os.setresgid(65534, 65534, 65534)
                os.setresuid(65534, 65534, 65534)
                os.write(write, str(fn()).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        with os.fdopen(read, "rb") as f:
            said = f.read().decode()
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, "the ordinary user's child failed"
        return said

    return run
