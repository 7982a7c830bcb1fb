"""Errors the user sees as one line: the CLI prints their message, not a traceback (``cli.user_errors``)."""

from __future__ import annotations

__all__ = ["UserFacingError"]


class UserFacingError(Exception):
    """An error whose message is the whole story for the user (no traceback)."""
