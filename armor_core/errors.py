"""Errors the user sees as one line: the CLI prints their message, not a traceback (``cli.user_errors``)."""

from __future__ import annotations

import traceback

__all__ = [
    "CodeExitError",
    "ConfigError",
    "GuardVerdictError",
    "NonFiniteError",
    "UserFacingError",
    "code_exit_error",
    "one_line",
]


class UserFacingError(Exception):
    """An error whose message is the whole story for the user (no traceback)."""


class NonFiniteError(UserFacingError):
    """The policy computed NaN or inf where it must not (a sampling distribution): its weights diverged."""


class GuardVerdictError(UserFacingError):
    """A guard returned a verdict its stage cannot carry out (``interfaces.GUARD_STAGES[stage].honours``), or one
    its ``actions`` did not declare: the run stops rather than log as done what was not done."""


class CodeExitError(UserFacingError):
    """Code a run called (a plugin, a tool, an environment, a reward file) raised ``SystemExit`` or another
    ``BaseException`` that is not an ``Exception`` where no one could turn it into a failed row or episode: the
    command stops with exit code 2 and this line, never as a success."""


def code_exit_error(error: BaseException, where: str) -> CodeExitError:
    """A ``CodeExitError`` for ``error`` raised in ``where`` (``"armor run"``, ``"the worker's generate"``),
    naming the line that raised it."""
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ else []
    at = f" at {frames[-1].filename}:{frames[-1].lineno} (in {frames[-1].name})" if frames else ""
    code = f"({error.code!r})" if isinstance(error, SystemExit) else f"({error})" if str(error) else ""
    return CodeExitError(
        f"{where}: code it ran raised {type(error).__name__}{code}{at}; a plugin, tool, environment or reward file "
        "must raise an Exception or return its error, never call sys.exit() or exit()"
    )


class ConfigError(ValueError):
    """A config value is wrong; the message names the key, the value and what is allowed."""


def one_line(error: BaseException) -> str:
    """``error: <message>`` on one line, as the CLI prints a user error (a library's multi-line
    message, a YAML parser's say, has its lines joined with spaces)."""
    return "error: " + " ".join(str(error).split())
