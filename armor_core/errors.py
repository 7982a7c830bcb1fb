"""Errors the user sees as one line: the CLI prints their message, not a traceback (``cli.user_errors``)."""

from __future__ import annotations

__all__ = ["ConfigError", "GuardVerdictError", "NonFiniteError", "UserFacingError", "one_line"]


class UserFacingError(Exception):
    """An error whose message is the whole story for the user (no traceback)."""


class NonFiniteError(UserFacingError):
    """The policy computed NaN or inf where it must not (a sampling distribution): its weights diverged."""


class GuardVerdictError(UserFacingError):
    """A guard returned a verdict its stage cannot carry out (``interfaces.GUARD_STAGES[stage].honours``), or one
    its ``actions`` did not declare: the run stops rather than log as done what was not done."""


class ConfigError(ValueError):
    """A config value is wrong; the message names the key, the value and what is allowed."""


def one_line(error: BaseException) -> str:
    """``error: <message>`` on one line, as the CLI prints a user error (a library's multi-line
    message, a YAML parser's say, has its lines joined with spaces)."""
    return "error: " + " ".join(str(error).split())
