"""The built-in ``table_lookup`` task: a question about a table the policy cannot see, only read with a tool.

Each row has its own small table of ``keys`` two-letter keys (letters of ``alphabet``, by default
``a`` to ``h``: 64 keys) with two-digit values, hidden in ``extra.tools_kwargs.lookup.table`` (the
``tools`` environment passes it to the ``lookup`` tool, ``armor_plugins.environments.builtin_tools:lookup``,
and never shows it to the policy). The prompt is one chat message, ``value of bd?``, and the answer is
the value stored under ``bd``: a policy has to call ``lookup`` with the right key and copy its result
into the final turn. Without the tool no policy beats chance (1 in 90), since the values are drawn
per row.

Rows route to ``data_source: table_lookup``; the answer is an integer, so a recipe scores it with
the ``arithmetic`` domain (exact integer match): ``reward.domain_map: {table_lookup: {arithmetic: 1.0}}``.

Held out: the keys are shared between the splits (a small set, so that RL sees each one often) and
the tables are not: ``train`` and ``test`` rows come from separate random streams (the split is part
of the seed), so a ``test`` question's table and answer are new, and an answer is never something a
policy could have memorised from training.

``python -m armor_plugins.tasks.table_lookup --split train --size N --seed S`` prints the task's
synthetic tool traces as JSONL (the prompt, the call, the tool's result, the final answer), the
``armor sft --data`` rows that the ``tools-tiny`` warm start was trained on.
"""

from __future__ import annotations

import argparse
import json
import string
import sys
from typing import Any

import numpy as np

from armor_core import hookimpl
from armor_core.hookspecs import RegisterTask

__all__ = ["generate_table_lookup", "tool_call_text", "tool_trace"]

_SPLITS = ("train", "test")
_TOOL = "lookup"


def tool_call_text(key: str) -> str:
    """The Hermes call a policy writes to read ``key``: compact JSON, fewest characters to learn."""
    return '<tool_call>{"name":"lookup","arguments":{"key":"' + key + '"}}</tool_call>'


def generate_table_lookup(
    split: str, size: int, seed: int, *, keys: int = 4, alphabet: str = "abcdefgh", **unknown: Any
) -> list[dict[str, Any]]:
    """Rows ``{"prompt": [{"role": "user", "content": "value of bd?"}], "data_source": "table_lookup",
    "ground_truth": "57", "extra_info": {"tools_kwargs": {"lookup": {"table": {"bd": 57, ...}}}}}``.

    :param split: ``train`` or ``test`` (``val`` and ``validation`` mean ``test``).
    :param keys: keys in each row's table (2 to 26); one of them is asked.
    :param alphabet: the lowercase letters keys are made of (two each).
    """
    if unknown:
        raise TypeError(f"table_lookup task: unknown parameter(s) {sorted(unknown)}; accepted: keys, alphabet")
    letters = sorted(set(alphabet))
    if len(letters) < 2 or not all(c in string.ascii_lowercase for c in letters):
        raise ValueError(f"table_lookup task: alphabet={alphabet!r} must be at least 2 lowercase letters")
    split_key = {"val": "test", "validation": "test"}.get(split, split)
    if split_key not in _SPLITS:
        raise ValueError(f"table_lookup task: split {split!r} is not one of 'train', 'test'")
    if not isinstance(keys, int) or not 2 <= keys <= 26:
        raise ValueError(f"table_lookup task: keys={keys!r} must be an integer from 2 to 26")
    if size < 0:
        raise ValueError(f"table_lookup task: size={size} must be >= 0")
    pool = [a + b for a in letters for b in letters]
    if keys > len(pool):
        raise ValueError(f"table_lookup task: keys={keys} is more than the {len(pool)} keys of alphabet={alphabet!r}")
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, _SPLITS.index(split_key), keys, len(pool)])
    rows = []
    for _ in range(size):
        names = [pool[i] for i in rng.choice(len(pool), size=keys, replace=False).tolist()]
        asked = names[0]
        values = rng.integers(10, 100, size=keys).tolist()
        table = {names[i]: values[i] for i in rng.permutation(keys).tolist()}
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"value of {asked}?"}],
                "data_source": "table_lookup",
                "ground_truth": str(table[asked]),
                "extra_info": {"tools_kwargs": {_TOOL: {"table": table}}},
            }
        )
    return rows


def tool_trace(row: dict[str, Any], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A row's ideal episode as ``armor sft --data`` trace: the prompt, the call, the result, the answer."""
    key = row["prompt"][-1]["content"].removeprefix("value of ").removesuffix("?")
    value = str(row["extra_info"]["tools_kwargs"][_TOOL]["table"][key])
    messages = [
        *row["prompt"],
        {"role": "assistant", "content": tool_call_text(key)},
        {"role": "tool", "content": value},
        {"role": "assistant", "content": value},
    ]
    return {"messages": messages, "tools": tools or [], "ground_truth": row["ground_truth"]}


def _main(argv: list[str] | None = None) -> int:
    from armor_plugins.environments.builtin_tools import lookup
    from armor_plugins.environments.schema import tool_schema

    p = argparse.ArgumentParser(description="print table_lookup tool traces as JSONL (armor sft --data rows)")
    p.add_argument("--split", default="train")
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keys", type=int, default=4)
    p.add_argument("--alphabet", default="abcdefgh")
    args = p.parse_args(argv)
    tools = [tool_schema(lookup)]
    for row in generate_table_lookup(args.split, args.size, args.seed, keys=args.keys, alphabet=args.alphabet):
        sys.stdout.write(json.dumps(tool_trace(row, tools)) + "\n")
    return 0


@hookimpl
def armor_register_tasks(register: RegisterTask) -> None:
    register("table_lookup", generate_table_lookup)


if __name__ == "__main__":
    raise SystemExit(_main())
