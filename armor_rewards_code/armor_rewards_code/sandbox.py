"""The local sandbox: runs ``harness.py`` in a fresh, limited, unprivileged process group.

Each run gets a new session (its own process group), an empty temporary directory as its working
directory (removed afterwards), a scrubbed environment, and, set in the child before ``exec``:

- resource limits: address space, processes, file size, open files, no core files, CPU time (the
  harness sets each test case's CPU limit to its time limit);
- a different user when started as root: a fresh unprivileged uid per run (so ``RLIMIT_NPROC``
  counts only this run's processes and a program cannot signal another run's);
- new user, network and mount namespaces where the kernel allows them (``unshare(CLONE_NEWUSER |
  CLONE_NEWNET | CLONE_NEWNS)``): only a loopback interface that is down, so no connection leaves the
  sandbox, and private tmpfs over the host's world-writable scratch directories;
- on top, or instead where namespaces are refused (seccomp in a container, user namespaces off), the
  unprivileged confinements of ``confine.py``: a seccomp filter that lets ``socket()`` make only local
  sockets, and Landlock, under which the run writes only beneath its working directory (and may not
  signal processes outside it). ``SandboxRun.isolated`` (the ``code`` domain's ``isolated`` sub-score)
  is True when network and host writes are both shut, by either means; ``require_isolation`` makes its
  absence an error instead. Each is probed once per sandbox; one that a run's child then fails to enter
  (the kernel's answer changed: seen in a process that had run for twenty minutes) is dropped for that
  run and the next, with a warning naming the error, and the run starts again without it;
- the parent-death signal, so a reward worker killed for ``reward.timeout_s`` takes its sandbox along.

The parent kills the whole process group at the run's end or deadline and, when it started as root, every
process of the run's uid (a program that left its group with ``setsid`` too). Not stopped (see the pack's
README): without root, such an escapee lives on until its CPU limit; files stay readable where the run's
user may read them.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
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

from armor_rewards_code.confine import block_network, confine_writes

__all__ = ["Confinement", "Limits", "LocalSandbox", "SandboxRun", "probe_confinement"]

HARNESS_SOURCE = (Path(__file__).parent / "harness.py").read_text(encoding="utf-8")
_CLONE_NEWUSER, _CLONE_NEWNET, _CLONE_NEWNS = 0x10000000, 0x40000000, 0x00020000
_NAMESPACES = _CLONE_NEWUSER | _CLONE_NEWNET | _CLONE_NEWNS
_MS_REC, _MS_PRIVATE, _MS_NOSUID, _MS_NODEV = 0x4000, 1 << 18, 2, 4
_SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")  # world-writable on the host: each gets a private tmpfs
_PR_SET_PDEATHSIG = 1
logger = logging.getLogger(__name__)
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


@dataclass(frozen=True)
class Confinement:
    """Which of the sandbox's confinements this kernel grants (each tried once, in a throwaway child).

    ``namespaces``: new user, network and mount namespaces; ``network``: the seccomp filter on
    ``socket()``; ``writes``: Landlock, writes only beneath the run's working directory. ``why`` names
    each one refused, and the error the kernel gave."""

    namespaces: bool
    network: bool
    writes: bool
    why: str = ""

    @property
    def isolated(self) -> bool:
        """No connection leaves the run and it writes nothing on the host but its own scratch directory."""
        return (self.namespaces or self.network) and (self.namespaces or self.writes)


def _granted(attempt) -> str:
    """ "" when ``attempt()`` succeeds in a forked child, else the error it raised there."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            attempt()
            os._exit(0)
        except BaseException as e:  # noqa: BLE001 - the child reports any failure and exits
            os.write(write, f"{type(e).__name__}: {e}".encode()[:500])
            os._exit(1)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        message = f.read().decode("utf-8", "replace")
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return "" if code == 0 else message or f"exit status {code}"


def _unshare() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_NAMESPACES) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS)")


def probe_confinement() -> Confinement:
    """What this process's children may use; the sandbox's runs are such children."""
    scratch = tempfile.mkdtemp(prefix="armor-code-probe-")
    try:
        errors = {
            "namespaces": _granted(_unshare),
            "network": _granted(block_network),
            "writes": _granted(lambda: confine_writes([scratch])),
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    why = "; ".join(f"{name}: {error}" for name, error in errors.items() if error)
    return Confinement(**{name: not error for name, error in errors.items()}, why=why)


class LocalSandbox:
    """Runs the harness under ``Limits``; ``run`` returns within its deadline plus the time to reap."""

    def __init__(self, limits: Limits | None = None, *, require_isolation: bool = False) -> None:
        self.limits = limits or Limits()
        self.confinement = probe_confinement()
        self.isolated = self.confinement.isolated
        self.require_isolation = require_isolation
        if require_isolation and not self.isolated:
            raise RuntimeError(
                f"code sandbox: this kernel refuses the confinements a run needs ({self.confinement.why}), and "
                "require_isolation is set; allow unprivileged user namespaces (or seccomp and Landlock), or use "
                "the remote backend"
            )
        self.python = sandbox_python()

    def _preexec(self, uid: int | None, workdir: str, others: int, error_fd: int) -> None:
        """In the child between fork and exec. An error aborts the exec, and its confinement and message go to
        ``error_fd`` first (``subprocess`` itself passes on no more than "Exception occurred in preexec_fn")."""
        stage = ["privileges"]
        try:
            self._confine(uid, workdir, others, stage)
        except BaseException as e:
            os.write(error_fd, f"{stage[0]}: {type(e).__name__}: {e}"[:1000].encode())
            raise

    def _confine(self, uid: int | None, workdir: str, others: int, stage: list[str]) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        lim = self.limits
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # after the uid change, which clears it
        writable = [workdir]
        if self.confinement.namespaces:
            stage[0] = "namespaces"
            _enter_namespaces(libc, lim.scratch_mb)
            workdir = "/tmp"
            writable = [path for path in _SCRATCH if os.path.isdir(path)]  # the private tmpfs, all three
        if self.confinement.writes:
            stage[0] = "writes"
            confine_writes(writable)
        if self.confinement.network:
            stage[0] = "network"
            block_network()
        stage[0] = "limits"
        mb = 1 << 20
        for rlim, value in (
            (resource.RLIMIT_AS, lim.memory_mb * mb),
            (resource.RLIMIT_FSIZE, lim.file_size_mb * mb),
            (resource.RLIMIT_NOFILE, lim.open_files),
            (resource.RLIMIT_CORE, 0),
        ):
            resource.setrlimit(rlim, (value, value))
        # the kernel counts the uid's tasks; outside a fresh uid or user namespace the user's others count too
        processes = lim.processes + (0 if uid is not None or self.confinement.namespaces else others)
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
        os.chdir(workdir)

    def run(self, config: dict, secret: dict | None, deadline_s: float) -> SandboxRun:
        """Run the harness on ``config`` (and ``secret``, sent after it) for at most ``deadline_s`` seconds."""
        from armor_rewards_code.harness import frame

        uid = 1_000_000 + secrets.randbelow(1_000_000) if os.geteuid() == 0 else None
        # runs in namespaces work in their private tmpfs; only the others need a host directory
        workdir = None if self.confinement.namespaces else tempfile.mkdtemp(prefix="armor-code-")
        try:
            if uid is not None and workdir is not None:
                os.chown(workdir, uid, uid)
            payload = frame({**config, "max_output": self.limits.output_bytes})
            payload += frame(secret) if secret is not None else b""
            return self._launch(payload, uid, workdir, deadline_s)
        except _Refused as refused:
            self._without(str(refused))
        finally:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
        return self.run(config, secret, deadline_s)  # again, without the confinement the kernel refused

    def _without(self, refused: str) -> None:
        """Go on without the confinement a run's child could not enter (``"namespaces: OSError: ..."``); the
        kernel granted it when probed, and refuses it now. Anything else, or a refusal that leaves
        ``require_isolation`` unmet, is an error naming it."""
        stage = refused.split(":", 1)[0]
        if stage not in ("namespaces", "writes", "network") or not getattr(self.confinement, stage):
            raise RuntimeError(f"code sandbox: a run could not start: {refused}")
        why = "; ".join(x for x in (self.confinement.why, f"refused at a run: {refused}") if x)
        self.confinement = dataclasses.replace(self.confinement, **{stage: False}, why=why)
        self.isolated = self.confinement.isolated
        logger.warning("code sandbox: going on without %s (%s)", stage, refused)
        if self.require_isolation and not self.isolated:
            raise RuntimeError(f"code sandbox: {refused}; require_isolation is set and the runs are no longer isolated")

    def _launch(self, payload: bytes, uid: int | None, workdir: str | None, deadline_s: float) -> SandboxRun:
        others = _tasks_of(os.getuid()) if uid is None and not self.confinement.namespaces else 0
        error_r, error_w = os.pipe()
        try:
            proc = subprocess.Popen(
                [self.python, "-I", "-S", "-c", HARNESS_SOURCE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=_ENV,
                cwd="/",
                start_new_session=True,
                preexec_fn=lambda: self._preexec(uid, workdir or "/tmp", others, error_w),
            )
        except subprocess.SubprocessError:
            os.close(error_w)
            with os.fdopen(error_r, "rb") as f:
                raise _Refused(f.read().decode("utf-8", "replace") or "the sandbox's child failed to start") from None
        os.close(error_r)
        os.close(error_w)
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
        try:
            if path and path.is_file() and all(p.stat().st_mode & 0o001 for p in [path, *path.parents]):
                return str(path)
        except OSError:  # a directory on its path this user may not enter
            continue
    raise RuntimeError(
        f"code sandbox: no Python interpreter that an unprivileged user may run ({sys.executable} lies under a "
        "directory others cannot enter); install python3 under /usr/bin"
    )


class _Refused(Exception):
    """The child of a run failed before its exec: the confinement it was entering and the error."""


def _tasks_of(uid: int) -> int:
    """How many tasks (threads) run under the real ``uid`` now: what ``RLIMIT_NPROC`` counts."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                status = Path(entry.path, "status").read_text()
                if int(status.split("\nUid:")[1].split()[0]) == uid:
                    count += int(status.split("\nThreads:")[1].split()[0])
            except (OSError, IndexError, ValueError):
                continue
    return count


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
