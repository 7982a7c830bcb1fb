"""The JSONL files the commands read (``armor sft --data``, ``armor rm train --pairs``): one reader, so a
line that is not JSON is reported the same way everywhere, naming the file and the line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

__all__ = ["json_lines"]


def json_lines(path: str | Path) -> Iterator[tuple[int, Any]]:
    """``(line number, parsed value)`` for every non-blank line of ``path``; a line that is not JSON is a
    ``ValueError`` naming the file, the line and the parser's complaint."""
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}, line {lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
