"""Two unprivileged confinements the sandbox stacks on its namespaces, or uses where those are refused.

- ``block_network``: a seccomp filter under which ``socket()`` makes only local sockets (``AF_UNIX``,
  ``AF_NETLINK``); every other family fails with ``EACCES``. ``io_uring_setup`` fails too (its socket
  operations would pass the filter by), and so does every system call of another ABI (x32, i386).
- ``confine_files``: a Landlock ruleset under which the process writes, creates, removes and renames only
  beneath the directories it is given (and writes ``/dev/null``), and, given the paths it may read, reads
  and executes nothing else: no other process's ``/proc``, no data file of the host. Where the kernel's
  Landlock ABI has scopes (6+), the process may neither signal nor reach the abstract Unix sockets of
  processes outside it.

Both are inherited by every child and cannot be undone. Both are called in the sandbox's child between
fork and exec; errors raise ``OSError`` there and the exec never happens.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

__all__ = ["block_network", "confine_files", "landlock_abi"]

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_LD_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_EACCES, _EPERM = 13, 1
_AF_UNIX, _AF_NETLINK = 1, 16
_IO_URING_SETUP = 425  # the same number on every 64-bit ABI
# machine -> (the audit arch seccomp reports, socket's number, the first number of a foreign ABI or None)
_ARCH = {
    "x86_64": (0xC000003E, 41, 0x40000000),  # x32 calls carry bit 30 under the same audit arch
    "aarch64": (0xC00000B7, 198, None),
}

_LANDLOCK_CREATE, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT = 444, 445, 446
_RULE_PATH_BENEATH, _CREATE_RULESET_VERSION = 1, 1
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR, _TRUNCATE = 1 << 0, 1 << 1, 1 << 2, 1 << 3, 1 << 14
_READS = _EXECUTE | _READ_FILE | _READ_DIR
_WRITES_BY_ABI = {  # the write-side rights each ABI knows
    1: sum(1 << b for b in (1, 4, 5, 6, 7, 8, 9, 10, 11, 12)),  # write, remove dir/file, make anything
    2: 1 << 13,  # REFER: link or rename into another directory
    3: _TRUNCATE,
}
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _check(rc: int, what: str) -> int:
    if rc < 0:
        raise OSError(ctypes.get_errno(), what)
    return rc


def _no_new_privs(libc: ctypes.CDLL) -> None:
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def _seccomp_program() -> bytes:
    machine = platform.machine()
    if machine not in _ARCH:
        raise OSError(_EPERM, f"seccomp network filter: no system call table for {machine}")
    arch, socket_nr, foreign = _ARCH[machine]
    prog = [
        (_LD_ABS, 0, 0, 4),  # seccomp_data.arch
        (_JEQ, 1, 0, arch),
        (_RET, 0, 0, _ERRNO | _EPERM),  # a call through another ABI's table (int 0x80)
        (_LD_ABS, 0, 0, 0),  # seccomp_data.nr
    ]
    if foreign is not None:
        prog += [(_JGE, 0, 1, foreign), (_RET, 0, 0, _ERRNO | _EPERM)]
    prog += [
        (_JEQ, 0, 1, _IO_URING_SETUP),
        (_RET, 0, 0, _ERRNO | _EPERM),
        (_JEQ, 1, 0, socket_nr),
        (_RET, 0, 0, _ALLOW),
        (_LD_ABS, 0, 0, 16),  # the low 32 bits of args[0], the address family (little-endian)
        (_JEQ, 2, 0, _AF_UNIX),
        (_JEQ, 1, 0, _AF_NETLINK),
        (_RET, 0, 0, _ERRNO | _EACCES),
        (_RET, 0, 0, _ALLOW),
    ]
    return b"".join(struct.pack("=HBBI", *insn) for insn in prog)


def block_network() -> None:
    """Install the seccomp filter described above on the calling process (and its future children)."""
    libc = _libc()
    program = _seccomp_program()
    filters = ctypes.create_string_buffer(program, len(program))
    fprog = struct.pack("=HxxxxxxQ", len(program) // 8, ctypes.addressof(filters))
    _no_new_privs(libc)
    _check(libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0), "seccomp filter")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where Landlock is missing or disabled."""
    rc = _libc().syscall(_LANDLOCK_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(rc), 0)


def confine_files(writable: list[str], readable: list[str] | None = None) -> None:
    """Restrict the calling process (and its future children) to writing beneath ``writable`` and to /dev/null;
    with ``readable``, to reading and executing only beneath those paths and ``writable`` too."""
    libc = _libc()
    abi = landlock_abi()
    if abi < 1:
        raise OSError(_EPERM, "Landlock is not available on this kernel")
    writes = sum(rights for version, rights in _WRITES_BY_ABI.items() if version <= abi)
    handled = writes | (_READS if readable is not None else 0)
    scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL if abi >= 6 else 0
    # struct landlock_ruleset_attr: handled_access_fs, handled_access_net (ABI 4), scoped (ABI 6)
    attr = struct.pack("=QQQ", handled, 0, scoped) if abi >= 6 else struct.pack("=Q", handled)
    ruleset = _check(
        libc.syscall(_LANDLOCK_CREATE, ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)), ctypes.c_uint32(0)),
        "landlock_create_ruleset",
    )
    file_rights = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE  # all a rule on a file (not a directory) may hold
    rules = [(path, handled) for path in writable] + [(os.devnull, handled & (_WRITE_FILE | _READ_FILE | _TRUNCATE))]
    rules += [(path, handled & _READS) for path in readable or []]
    try:
        for path, rights in rules:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                if not os.path.isdir(path):
                    rights &= file_rights
                rule = struct.pack("=Qi", rights, fd)  # struct landlock_path_beneath_attr, packed
                _check(
                    libc.syscall(_LANDLOCK_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.c_char_p(rule), 0),
                    f"landlock_add_rule({path})",
                )
            finally:
                os.close(fd)
        _no_new_privs(libc)
        _check(libc.syscall(_LANDLOCK_RESTRICT, ruleset, ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset)
