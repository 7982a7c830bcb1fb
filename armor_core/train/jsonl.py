"""The JSONL files the commands read (``armor sft --data``, ``armor rm train --pairs``): one reader, so a
line that is not JSON is reported the same way everywhere, naming the file and the line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

__all__ = ["json_lines"]


def json_lines(path: str | Path) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed value)`` for every non-blank line of ``path``; a line that is not UTF-8 or not JSON
    is a ``ValueError`` naming the file, the line and what is wrong (read as bytes and decoded line by line:
    a text-mode reader's error names neither)."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}, line {lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at the line's byte "
                    f"{e.start + 1}); save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}, line {lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
