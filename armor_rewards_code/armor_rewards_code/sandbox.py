"""The local sandbox: runs ``harness.py`` in a fresh, limited, unprivileged process group.

Each run gets a new session (its own process group), an empty temporary directory as its working
directory (removed afterwards), a scrubbed environment, and, set in the child before ``exec``:

- resource limits: address space, processes, file size, open files, no core files, CPU time (the
  harness sets each test case's CPU limit to its time limit);
- a different user when started as root: a fresh unprivileged uid per run (so ``RLIMIT_NPROC``
  counts only this run's processes and a program cannot signal another run's);
- a new user and network namespace where the kernel allows it (``unshare(CLONE_NEWUSER |
  CLONE_NEWNET)``): only a loopback interface that is down, so no connection leaves the sandbox.
  Where it is refused (seccomp in a container, user namespaces off) the run goes on in the weaker
  mode and ``SandboxRun.isolated`` is False (the ``code`` domain's ``isolated`` sub-score);
  ``require_isolation`` makes that an error instead;
- the parent-death signal, so a reward worker killed for ``reward.timeout_s`` takes its sandbox along.

The parent kills the whole process group at the run's end or deadline and, when it started as root, every
process of the run's uid (a program that left its group with ``setsid`` too). Not stopped (see the pack's
README): without root, such an escapee lives on until its CPU limit; files stay readable where the run's
user may read them.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Limits", "LocalSandbox", "SandboxRun"]

HARNESS_SOURCE = (Path(__file__).parent / "harness.py").read_text(encoding="utf-8")
_CLONE_NEWUSER, _CLONE_NEWNET, _CLONE_NEWNS = 0x10000000, 0x40000000, 0x00020000
_NAMESPACES = _CLONE_NEWUSER | _CLONE_NEWNET | _CLONE_NEWNS
_MS_REC, _MS_PRIVATE, _MS_NOSUID, _MS_NODEV = 0x4000, 1 << 18, 2, 4
_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")  # world-writable on the host: each gets a private tmpfs
_PR_SET_PDEATHSIG = 1
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/nonexistent"}


@dataclass(frozen=True)
class Limits:
    """Limits of one sandbox run (per process where the kernel counts per process)."""

    memory_mb: int = 512
    processes: int = 32
    file_size_mb: int = 16
    open_files: int = 64
    output_bytes: int = 1 << 20
    scratch_mb: int = 64


@dataclass(frozen=True)
class SandboxRun:
    """What the harness reported (None when it reported nothing), and how the run was confined."""

    report: dict | None
    isolated: bool
    killed: bool
    stderr: str


def _namespaces_allowed() -> bool:
    """Whether this kernel lets a process make a user + network namespace (tried in a throwaway child)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0 if ctypes.CDLL(None, use_errno=True).unshare(_NAMESPACES) == 0 else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


class LocalSandbox:
    """Runs the harness under ``Limits``; ``run`` returns within its deadline plus the time to reap."""

    def __init__(self, limits: Limits | None = None, *, require_isolation: bool = False) -> None:
        self.limits = limits or Limits()
        self.isolated = _namespaces_allowed()
        if require_isolation and not self.isolated:
            raise RuntimeError(
                "code sandbox: this kernel refuses a user+network namespace (unshare), and require_isolation is set; "
                "allow unprivileged user namespaces or use the remote backend"
            )
        self.python = sandbox_python()

    def _preexec(self, uid: int | None, workdir: str) -> None:
        """In the child between fork and exec: drop privileges, namespaces, limits. Errors abort the exec."""
        libc = ctypes.CDLL(None, use_errno=True)
        lim = self.limits
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
        if self.isolated:
            _enter_namespaces(libc, lim.scratch_mb)
            workdir = "/tmp"
        mb = 1 << 20
        for rlim, value in (
            (resource.RLIMIT_AS, lim.memory_mb * mb),
            (resource.RLIMIT_FSIZE, lim.file_size_mb * mb),
            (resource.RLIMIT_NOFILE, lim.open_files),
            (resource.RLIMIT_CORE, 0),
        ):
            resource.setrlimit(rlim, (value, value))
        if uid is not None or self.isolated:  # otherwise NPROC would count all of the user's own processes
            resource.setrlimit(resource.RLIMIT_NPROC, (lim.processes, lim.processes))
        os.chdir(workdir)

    def run(self, config: dict, secret: dict | None, deadline_s: float) -> SandboxRun:
        """Run the harness on ``config`` (and ``secret``, sent after it) for at most ``deadline_s`` seconds."""
        from armor_rewards_code.harness import frame

        uid = 1_000_000 + secrets.randbelow(1_000_000) if os.geteuid() == 0 else None
        # isolated runs work in their private tmpfs; only the weaker mode needs a host directory
        workdir = None if self.isolated else tempfile.mkdtemp(prefix="armor-code-")
        try:
            if uid is not None and workdir is not None:
                os.chown(workdir, uid, uid)
            payload = frame({**config, "max_output": self.limits.output_bytes})
            payload += frame(secret) if secret is not None else b""
            return self._launch(payload, uid, workdir, deadline_s)
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)

    def _launch(self, payload: bytes, uid: int | None, workdir: str | None, deadline_s: float) -> SandboxRun:
        proc = subprocess.Popen(
            [self.python, "-I", "-S", "-c", HARNESS_SOURCE],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_ENV,
            cwd="/",
            start_new_session=True,
            preexec_fn=lambda: self._preexec(uid, workdir or "/tmp"),
        )
        killed = False
        try:
            out, err = proc.communicate(payload, timeout=deadline_s)
        except subprocess.TimeoutExpired:
            killed = True
            _kill_group(proc.pid)
            try:
                out, err = proc.communicate(timeout=2.0)
            except subprocess.TimeoutExpired:  # an escaped process holds the pipes: give up on them
                out, err = b"", b""
                proc.kill()
        finally:
            _kill_group(proc.pid)
            if uid is not None:
                _kill_user(uid)
        return SandboxRun(_parse(out), self.isolated, killed, err.decode("utf-8", "replace")[-2000:])


def _enter_namespaces(libc: ctypes.CDLL, scratch_mb: int) -> None:
    """New user, network and mount namespaces; the run's own uid mapped to itself (a tmpfs needs its files'
    owner mapped); private, size-limited tmpfs over the host's world-writable directories."""
    uid, gid = os.getuid(), os.getgid()
    libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: a uid change cleared it, and /proc/self/uid_map needs it
    if libc.unshare(_NAMESPACES) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    for path in _SCRATCH:
        if os.path.isdir(path):
            options = f"size={scratch_mb}m,mode=1777".encode()
            if libc.mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
                raise OSError(ctypes.get_errno(), f"mount tmpfs on {path}")


def sandbox_python() -> str:
    """A Python 3.9+ that any user may run: every directory on its path searchable by others (this
    interpreter's when it is, else the system's ``python3``); the harness needs only the standard library."""
    for candidate in (sys.executable, shutil.which("python3", path=_ENV["PATH"]) or ""):
        path = Path(os.path.realpath(candidate)) if candidate else None
        if path and path.is_file() and all(p.stat().st_mode & 0o001 for p in [path, *path.parents]):
            return str(path)
    raise RuntimeError(
        f"code sandbox: no Python interpreter that an unprivileged user may run ({sys.executable} lies under a "
        "directory others cannot enter); install python3 under /usr/bin"
    )


def _kill_user(uid: int) -> None:
    """Kill every process of the run's own uid, those that left its process group (``setsid``) too: a child
    that becomes that uid and signals -1 (all it may signal: that uid's processes)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setresuid(uid, uid, uid)
            os.kill(-1, signal.SIGKILL)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _parse(out: bytes) -> dict | None:
    """The harness's one result frame; anything else (nothing, garbage, extra bytes) is no report."""
    try:
        size = int(out[:16])
        if len(out) != 16 + size:
            return None
        report = json.loads(out[16:])
    except ValueError:
        return None
    return report if isinstance(report, dict) else None
