"""What a sandboxed run sees of the host, and the process that outlives it to end everything it started.

Called in the sandbox's child between fork and exec (``sandbox.py``), in this order:

- ``unshare_run(user)``: new mount, PID, network and IPC namespaces; with ``user``, in a new user namespace
  too (the caller's uid mapped to itself), which is how an ordinary user may mount. Root needs none.
- ``supervise()``: forks. The parent stays, as the run's supervisor: a child subreaper (every orphan of
  the run becomes its child, whatever ``setsid`` or double fork it tried) that waits for its one child, then
  kills every process left beneath it and exits with the child's status (128 + the signal when one killed
  it). ``SIGTERM`` (the sandbox's deadline, or the parent-death signal of a killed reward worker) makes it
  kill them all at once, as does finding its parent gone (it looks every 0.1 s). It finds them through the
  host's ``/proc``, held open from before the fork: the child's ``pivot_root`` moves its root too. Running as
  the run's own uid (root's runs without namespaces), it last signals every process of that uid, so none
  that left its tree some other way outlives it either, whoever its parent (the reward worker, which does
  the same, may be dead). The child
  returns, to become the harness; in a new PID namespace it is that namespace's init, whose end kills every
  process of the namespace, and which its programs cannot signal.
- ``enter_root(tree, scratch_mb)``: in that child, a root of its own: a small read-only tmpfs holding the
  host's system directories (``system_tree``: ``/usr`` and the library directories, bound read-only, and the
  interpreter's prefix where it lies elsewhere), ``/dev/null`` and the random devices, a fresh ``/proc``
  of the new PID namespace, and a size-limited tmpfs at ``/tmp`` (also ``/dev/shm``), the working directory.
  No home, no data, no other process: the host's root is detached by ``pivot_root``.

Without namespaces, ``system_tree`` is what Landlock lets a run read (``confine.confine_files``), and the
parent ends a run its own ways too: ``kill_user`` (root: every process of the run's uid), ``disk_usage`` (of
a scratch directory on the host's disk, which no tmpfs caps). ``oom_first``: the run's first process, and all it
starts, the kernel's first choice under memory pressure.
"""

from __future__ import annotations

import ctypes
import os
import platform
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Tree",
    "disk_usage",
    "enter_root",
    "kill_group",
    "kill_user",
    "oom_first",
    "supervise",
    "system_tree",
    "trial",
    "unshare_run",
]

_CLONE_NEWNS, _CLONE_NEWPID, _CLONE_NEWNET, _CLONE_NEWIPC = 0x00020000, 0x20000000, 0x40000000, 0x08000000
_CLONE_NEWUSER = 0x10000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REMOUNT, _MS_BIND, _MS_REC = 1, 2, 4, 8, 32, 4096, 0x4000
_MS_PRIVATE, _MNT_DETACH = 1 << 18, 2
# statvfs's f_flag bits -> the mount flags to keep: a user namespace may not clear those of the host's mount
_KEPT = {2: _MS_NOSUID, 4: _MS_NODEV, 8: _MS_NOEXEC, 1024: 1024, 2048: 2048, 4096: 1 << 21}
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4
_NEW_ROOT = "/tmp"  # any directory: the new root's tmpfs covers it in the run's private mount namespace only
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_DEV_LINKS = (
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
)


@dataclass(frozen=True)
class Tree:
    """The host paths a run may read: directories and files (bound read-only), and symbolic links (copied)."""

    dirs: tuple[str, ...]
    files: tuple[str, ...]
    links: tuple[tuple[str, str], ...]

    @property
    def readable(self) -> list[str]:
        """Every path of the tree and the devices, for a Landlock ruleset."""
        return [*self.dirs, *self.files, *(d for d in _DEVICES if os.path.exists(d))]


def system_tree(python: str) -> Tree:
    """``/usr``, the library and binary directories (symlinks where the host merged them into ``/usr``), the
    prefix of ``python`` where it lies outside them, and what the dynamic loader reads in ``/etc``."""
    dirs, links = [], []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            links.append((top, os.readlink(top)))
        elif os.path.isdir(top):
            dirs.append(top)
    prefix = Path(os.path.realpath(python)).parents[1]  # /opt/py for /opt/py/bin/python3
    if prefix != Path("/") and not any(prefix.is_relative_to(d) for d in dirs):
        dirs.append(str(prefix))
    files = [f for f in ("/etc/ld.so.cache",) if os.path.isfile(f)]
    links += [(f, os.readlink(f)) for f in ("/etc/localtime",) if os.path.islink(f)]
    return Tree(tuple(dirs), tuple(files), tuple(links))


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise OSError(ctypes.get_errno(), what)


def unshare_run(user: bool) -> None:
    """New mount, PID, network and IPC namespaces (and a user namespace, mapping this uid to itself, with
    ``user``); the PID namespace is its children's, the next fork's child its init."""
    libc = _libc()
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWNET | _CLONE_NEWIPC
    if user:
        libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: a uid change cleared it, and /proc/self/uid_map needs it
    _check(libc.unshare(flags | (_CLONE_NEWUSER if user else 0)), "unshare")
    if user:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)


def _mount(libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    def enc(text: str | None) -> bytes | None:
        return text.encode() if text is not None else None

    _check(libc.mount(enc(source), target.encode(), enc(fstype), flags, data.encode() or None), f"mount {target}")


def _bind(libc: ctypes.CDLL, source: str, target: str, readonly: bool) -> None:
    _mount(libc, source, target, None, _MS_BIND | _MS_REC)
    if readonly:
        kept = sum(flag for bit, flag in _KEPT.items() if os.statvfs(source).f_flag & bit)
        _mount(libc, None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | kept)


def _touch(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "x").close()


def enter_root(tree: Tree, scratch_mb: int) -> None:
    """Make the calling process's root the minimal tree described above; its working directory is ``/``."""
    libc = _libc()
    new = _NEW_ROOT
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE)
    _mount(libc, "tmpfs", new, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,mode=755")
    for path in tree.dirs:
        os.makedirs(new + path)
        _bind(libc, path, new + path, readonly=True)
    for path in tree.files:
        _touch(new + path)
        _bind(libc, path, new + path, readonly=True)
    for path, target in tree.links:
        os.makedirs(os.path.dirname(new + path), exist_ok=True)
        os.symlink(target, new + path)
    for device in (d for d in _DEVICES if os.path.exists(d)):
        _touch(new + device)
        _bind(libc, device, new + device, readonly=False)
    for name, target in _DEV_LINKS:
        os.symlink(target, f"{new}/dev/{name}")
    os.mkdir(new + "/proc")
    try:
        _mount(libc, "proc", new + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    except OSError:  # a user namespace on a host whose /proc is partly covered (a container): no /proc at all
        pass
    os.mkdir(new + "/tmp")
    _mount(libc, "tmpfs", new + "/tmp", "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={scratch_mb}m,mode=1777")
    os.mkdir(new + "/dev/shm")
    _bind(libc, new + "/tmp", new + "/dev/shm", readonly=False)
    os.mkdir(new + "/.old")
    machine = platform.machine()
    if machine not in _PIVOT_ROOT:
        raise OSError(1, f"pivot_root: no system call number for {machine}")
    _check(libc.syscall(_PIVOT_ROOT[machine], new.encode(), (new + "/.old").encode()), "pivot_root")
    os.chdir("/")
    _check(libc.umount2(b"/.old", _MNT_DETACH), "umount the host's root")
    os.rmdir("/.old")
    _mount(libc, None, "/", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)


def trial(tree: Tree, user: bool) -> None:
    """``unshare_run`` and ``enter_root`` as a run does them, in a child that exits; raises (or exits 1, its
    child having said why) where the kernel refuses a step. For ``probe_confinement``'s throwaway child."""
    unshare_run(user)
    pid = os.fork()
    if pid == 0:
        enter_root(tree, 1)
        os._exit(0)
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
        os._exit(1)


def supervise(scratch: str | None = None, own_uid: bool = False) -> None:
    """Fork: the child returns (the run), the parent supervises it as described above and never returns; at
    the end it removes ``scratch`` too (a directory on the host's disk), which a killed worker cannot. With
    ``own_uid`` (this process runs as a uid no one but the run has) it last kills every process of that uid."""
    libc = _libc()
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1)
    worker = os.getppid()
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # the reward worker died: end the run, then go
    supervisor = os.getpid()
    # the host's /proc, opened before the fork: with namespaces the child's ``pivot_root`` moves this process's
    # root too (they share a mount namespace), and the /proc found there is the run's, which shows no pid of ours
    proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    child = os.fork()
    if child == 0:
        os.close(proc)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() not in (supervisor, 0):  # 0: the parent is outside this new PID namespace
            os._exit(1)
        return
    code = 1
    try:
        os.closerange(0, proc)  # the pipes and the exec error pipe are the run's alone
        os.closerange(proc + 1, os.sysconf("SC_OPEN_MAX"))
        status = _wait(child, worker)
        code = 128 + signal.SIGKILL if status is None else os.waitstatus_to_exitcode(status)
        code = 128 - code if code < 0 else code
        _end_all(child, proc)
    finally:
        if own_uid:  # every process this uid may signal, which is the run's alone (kill(-1) spares the caller)
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass  # none left
        if scratch is not None:  # whatever went wrong above: nothing else removes it after a killed worker
            shutil.rmtree(scratch, ignore_errors=True)
        os._exit(code)


def _wait(child: int, worker: int) -> int | None:
    """The child's wait status, reaping the run's orphans meanwhile; None when SIGTERM came first, or the
    reward worker is gone (the parent-death signal is the fast way to learn it, not the only one: a worker
    that died before it was set, or a signal the kernel did not send, would leave the run going)."""
    watched = {signal.SIGCHLD, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    while True:
        if os.getppid() != worker:
            return None
        pid, status = os.waitpid(-1, os.WNOHANG)
        while pid and pid != child:
            pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == child:
            return status
        info = signal.sigtimedwait(watched, 0.1)
        if info is not None and info.si_signo == signal.SIGTERM:
            return None


def _end_all(child: int, proc: int, within_s: float = 2.0) -> None:
    """SIGKILL every process beneath this one, again until none is left (their orphans come here) or time's up:
    ``child`` first (in a PID namespace, its init: the kernel ends the whole namespace with it), then every
    descendant the host's /proc (``proc``, a directory descriptor) shows."""
    try:
        os.kill(child, signal.SIGKILL)
    except OSError:
        pass  # reaped already
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return  # no child left, so no descendant either
        for pid in _descendants(os.getpid(), proc):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.002)


def _descendants(root: int, proc: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir(proc):
        if entry.name.isdigit():
            try:
                fd = os.open(f"{entry.name}/stat", os.O_RDONLY, dir_fd=proc)
                with open(fd, "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            found.append(pid)
            todo.append(pid)
    return found


def oom_first(libc: ctypes.CDLL) -> None:
    """Under memory pressure the kernel ends the run's processes first (they inherit the score), not the supervisor
    (a fork of the reward worker, as large as it) nor the trainer. Any process may raise its own score; after a uid
    change its /proc files are root's until it is dumpable again, so it is, for the write. Defence in depth, not
    confinement: a kernel that refuses the write leaves the score as it was."""
    was = libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0)
    libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    finally:
        libc.prctl(_PR_SET_DUMPABLE, was, 0, 0, 0)


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_user(uid: int) -> None:
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


def disk_usage(directory: str) -> int:
    """Bytes the files beneath ``directory`` hold on disk (a sparse file counts what it holds)."""
    total = 0
    for parent, dirs, files in os.walk(directory):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_blocks * 512
            except OSError:
                continue
    return total
