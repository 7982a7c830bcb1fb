"""What a worker group raises when its workers cannot start, be reached or keep running, and ``death_cause``,
Ray's account of why a worker died, shortened to what a user acts on."""

from __future__ import annotations

from armor_core.errors import UserFacingError

__all__ = ["ChannelError", "PlacementError", "WorkerDiedError", "death_cause"]


class WorkerDiedError(UserFacingError):
    """A worker process of a group died or failed while its peers waited; the group has been stopped."""


class ChannelError(UserFacingError):
    """The driver could not open the direct channel (``channel.py``) to a worker."""


class PlacementError(UserFacingError):
    """The cluster cannot hold a worker group's placement group."""


def death_cause(err: Exception) -> str:
    """Ray's account of why an actor died, shortened to what a user acts on.

    A process killed by a signal (the kernel's OOM killer and ``kill -9`` both send SIGKILL) or
    crashed looks the same to Ray: its connection drops. Ray's own memory monitor says so by name.
    """
    text = " ".join(str(getattr(err, "error_msg", None) or err).split())
    exit_type = text.split("Worker exit type:", 1)[1].split()[0] if "Worker exit type:" in text else ""
    detail = text.split("Worker exit detail:", 1)[1].split(". ")[0].strip() if "Worker exit detail:" in text else ""
    if "memory monitor" in text or "OutOfMemory" in type(err).__name__:
        kind = "killed by Ray's memory monitor: the node ran out of memory"
    elif "connection error" in detail:
        kind = (
            "its process vanished: killed by a signal (SIGKILL from the kernel's OOM killer or `kill -9`) "
            "or crashed (SIGSEGV); check `dmesg` on that node for OOM"
        )
    elif exit_type == "INTENDED_USER_EXIT" or "ray.kill" in text:
        kind = "stopped on purpose (ray.kill or exit())"
    elif "exit code" in text or "exited" in text:
        kind = "its process exited"
    else:
        kind = "died"
    return kind + (f" [Ray: {exit_type}{': ' + detail if detail else ''}]" if exit_type else "")
