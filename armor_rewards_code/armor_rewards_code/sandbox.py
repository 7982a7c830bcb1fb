"""The local sandbox: runs ``harness.py`` in a fresh, limited, unprivileged process tree that sees nothing of the host.

Each run gets a new session, a scrubbed environment, and, set in its child before ``exec``:

- a supervisor (``jail.supervise``): the child forks once more; the process that stays is a child subreaper
  that ends every process of the run when the harness ends, when the run's deadline passes, or when the
  reward worker dies (its parent-death signal), whatever the program did to leave its group;
- its own mount, PID, network and IPC namespaces where the kernel allows them (as root, or in a user
  namespace as an ordinary user; ``jail.py``): a read-only root holding only what Python needs, a ``/proc``
  of its own processes, a private size-limited tmpfs at ``/tmp`` (its working directory), and only a
  loopback that is down. The harness is the PID namespace's init, so its end kills every process of the run;
- a different user when started as root: a fresh unprivileged uid per run (so ``RLIMIT_NPROC`` counts only
  this run's processes and a program cannot signal another run's);
- on top, or instead where namespaces are refused, the unprivileged confinements of ``confine.py``: a
  seccomp filter that lets ``socket()`` make only local sockets, and Landlock, under which the run writes
  only beneath its working directory and, without namespaces, reads only the system directories Python
  needs (``jail.system_tree``) and that directory. ``SandboxRun.isolated`` (the ``code`` domain's ``isolated``
  sub-score) is True when network, host writes and host reads are all shut, by either means;
  ``require_isolation`` makes its absence an error instead. Each is probed once per sandbox; one that a
  run's child then fails to enter (the kernel's answer changed: seen in a process that had run for twenty
  minutes) is dropped for that run and the next, with a warning naming the error, and the run starts again
  without it;
- resource limits: address space, processes, file size, open files, no core files, CPU time (the harness
  sets each test case's CPU limit to its time limit). Without namespaces the parent watches the scratch
  directory's size and stops a run past ``Limits.scratch_mb``.

The parent also kills the session at the end and, when it started as root without namespaces, every
process of the run's uid. Not stopped (see the pack's README): memory is limited per process.
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
import time
from dataclasses import dataclass
from pathlib import Path

from armor_rewards_code.confine import block_network, confine_files
from armor_rewards_code.jail import (
    Tree,
    disk_usage,
    enter_root,
    kill_group,
    kill_user,
    oom_first,
    supervise,
    system_tree,
    trial,
    unshare_run,
)

__all__ = ["Confinement", "Limits", "LocalSandbox", "SandboxRun", "probe_confinement"]

HARNESS_SOURCE = (Path(__file__).parent / "harness.py").read_text(encoding="utf-8")
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_WATCH_S = 0.05  # how often a scratch directory on the host's disk is measured
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
    """What the harness reported (None when it reported nothing), and how the run was confined and ended:
    ``killed`` at its deadline, or stopped for the ``error`` the sandbox names (its scratch cap); else the
    harness ended by itself, as ``ended`` says ("exit status 1", "killed by SIGKILL"), after ``seconds``."""

    report: dict | None
    isolated: bool
    killed: bool
    stderr: str
    seconds: float = 0.0
    ended: str = ""
    error: str = ""


@dataclass(frozen=True)
class Confinement:
    """Which of the sandbox's confinements this kernel grants (each tried once, in a throwaway child).

    ``namespaces``: own mount, PID, network and IPC namespaces (``jail.py``), entered as root, or through a
    user namespace (``userns``: an ordinary user's way, and root's where the kernel refuses root the other);
    ``network``: the seccomp filter on ``socket()``; ``files``: Landlock, writes only beneath the run's
    working directory and reads only of the system directories and that one. ``why`` names each one
    refused, and the error the kernel gave."""

    namespaces: bool
    network: bool
    files: bool
    why: str = ""
    userns: bool = False

    @property
    def isolated(self) -> bool:
        """No connection leaves the run, and it reads and writes nothing of the host but what Python needs."""
        return (self.namespaces or self.network) and (self.namespaces or self.files)


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


def _become(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _fresh_uid() -> int:
    return 1_000_000 + secrets.randbelow(1_000_000)


def _user_trial(tree: Tree, root: bool) -> None:
    if root:
        _become(_fresh_uid())  # a run's way when root's own is refused: its uid first, then a user namespace
    trial(tree, user=True)


def probe_confinement() -> Confinement:
    """What this process's children may use; the sandbox's runs are such children."""
    tree = system_tree(sandbox_python())
    root = os.geteuid() == 0
    scratch = tempfile.mkdtemp(prefix="armor-code-probe-")
    try:
        as_root = _granted(lambda: trial(tree, user=False)) if root else "not root"
        as_user = _granted(lambda: _user_trial(tree, root)) if as_root else ""  # needed only where root's way fails
        errors = {
            "namespaces": as_user and (f"as root: {as_root}; in a user namespace: {as_user}" if root else as_user),
            "network": _granted(block_network),
            "files": _granted(lambda: confine_files([scratch], tree.readable)),
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    why = "; ".join(f"{name}: {error}" for name, error in errors.items() if error)
    return Confinement(**{name: not error for name, error in errors.items()}, why=why, userns=bool(as_root))


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
        self.tree: Tree = system_tree(self.python)

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
        lim, conf = self.limits, self.confinement
        # root makes the namespaces itself, then drops to the run's uid; otherwise a user namespace does
        as_root = conf.namespaces and uid is not None and not conf.userns
        if uid is not None and not as_root:
            _become(uid)
        if conf.namespaces:
            stage[0] = "namespaces"
            unshare_run(user=not as_root)
        stage[0] = "supervisor"
        # from here on, in its child: the run's first process; a supervisor that took the run's fresh uid ends
        # whatever of that uid is left
        supervise(None if conf.namespaces else workdir, own_uid=uid is not None and not as_root)
        oom_first(libc)
        readable: list[str] | None = self.tree.readable
        if conf.namespaces:
            stage[0] = "namespaces"
            enter_root(self.tree, lim.scratch_mb)
            workdir, readable = "/tmp", None  # the root holds nothing else to read
        if as_root:
            stage[0] = "privileges"
            _become(uid)  # type: ignore[arg-type]
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # the uid change cleared the one ``supervise`` set
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no set-uid program gives root back
        if conf.files:
            stage[0] = "files"
            confine_files([workdir], readable)
        if conf.network:
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
        # the kernel counts the uid's tasks; outside a fresh uid or user namespace the user's others (and the
        # supervisor) count too
        processes = lim.processes + (0 if uid is not None or conf.namespaces else others + 1)
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
        os.chdir(workdir)

    def run(self, config: dict, secret: dict | None, deadline_s: float) -> SandboxRun:
        """Run the harness on ``config`` (and ``secret``, sent after it) for at most ``deadline_s`` seconds."""
        from armor_rewards_code.harness import frame

        uid = _fresh_uid() if os.geteuid() == 0 else None
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
        if stage not in ("namespaces", "files", "network") or not getattr(self.confinement, stage):
            raise RuntimeError(f"code sandbox: a run could not start: {refused}")
        why = "; ".join(x for x in (self.confinement.why, f"refused at a run: {refused}") if x)
        self.confinement = dataclasses.replace(self.confinement, **{stage: False}, why=why)
        self.isolated = self.confinement.isolated
        logger.warning("code sandbox: going on without %s (%s)", stage, refused)
        if self.require_isolation and not self.isolated:
            raise RuntimeError(f"code sandbox: {refused}; require_isolation is set and the runs are no longer isolated")

    def _launch(self, payload: bytes, uid: int | None, workdir: str | None, deadline_s: float) -> SandboxRun:
        start = time.monotonic()
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
        try:
            out, err, stopped = self._communicate(proc, payload, workdir, start + deadline_s)
        finally:
            kill_group(proc.pid)  # the supervisor ended the rest; this covers a supervisor that died first
            if uid is not None and not self.confinement.namespaces:
                kill_user(uid)  # and this a setsid escapee that outlived both
        seconds = time.monotonic() - start
        code = proc.returncode  # the supervisor's: the harness's exit status, or 128 + the signal that killed it
        ended = "" if code is None else f"killed by {_signal_name(code - 128)}" if code > 128 else f"exit status {code}"
        report = None if stopped and stopped != "deadline" else _parse(out)
        error = "" if stopped == "deadline" else stopped
        return SandboxRun(
            report, self.isolated, stopped == "deadline", err.decode("utf-8", "replace")[-2000:], seconds, ended, error
        )

    def _communicate(self, proc: subprocess.Popen, payload: bytes, workdir: str | None, deadline: float):
        """(stdout, stderr, why the run was stopped: "deadline", its scratch cap, or "" when it ended by itself).
        A scratch directory on the host's disk (no namespaces) is measured every ``_WATCH_S``."""
        data: bytes | None = payload
        while True:
            left = deadline - time.monotonic()
            try:
                out, err = proc.communicate(data, timeout=max(0.0, min(left, _WATCH_S) if workdir else left))
                return out, err, ""
            except subprocess.TimeoutExpired:
                data = None
            if time.monotonic() >= deadline:
                stopped = "deadline"
            elif workdir is not None and disk_usage(workdir) > self.limits.scratch_mb << 20:
                stopped = f"the program's files passed the scratch cap of {self.limits.scratch_mb} MB"
            else:
                continue
            try:
                os.kill(proc.pid, signal.SIGTERM)  # the supervisor kills every process of the run, then exits
                out, err = proc.communicate(timeout=2.0)
            except subprocess.TimeoutExpired:  # a supervisor that does not answer: its group, then give up
                kill_group(proc.pid)
                proc.kill()
                proc.wait()
                out, err = b"", b""
            return out, err, stopped


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


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


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
