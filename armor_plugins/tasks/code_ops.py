"""The built-in ``code_ops`` task: a described computation, answered by a one-line Python program.

A prompt names an operation and a number, ``"add 12:"``; the answer is a program that reads its input
from stdin and prints the result, ``print(int(input())+12)``. The row is checked by running the program
on stdin/stdout cases (the ``code`` reward domain of armor-rewards-code, ``data_source: code``), so any
program that prints the right outputs passes, not only the reference. The response is the whole program,
without a fence: score it with ``reward.domain_kwargs.code.whole_response: true`` (``recipe:code`` does).

Operations (``N`` in the prompt; the input is an integer for the first three, a lowercase word for the others):

- ``add N``: ``print(int(input())+N)``, N from 0 to 99;
- ``sub N``: ``print(int(input())-N)``, N from 0 to 99;
- ``times N``: ``print(int(input())*N)``, N from 0 to 99;
- ``first N``: ``print(input()[:N])``, N from 1 to 20;
- ``last N``: ``print(input()[-N:])``, N from 1 to 20;
- ``repeat N``: ``print(input()*N)``, N from 1 to 9.

Each row has ``cases`` stdin/stdout cases (3 by default) drawn by the seed; its ground truth is
``{"inputs": [...], "outputs": [...]}`` as a JSON string, and the row's ``response`` is the reference
program (``armor sft`` trains on it; the reward never sees it). A program that ignores its input
(``print(17)``) fails as soon as two cases differ.

Held out: every problem ``(operation, N)`` belongs to one split by the arithmetic task's fixed hash
(``split_of``), never by the seed, so ``test`` problems are never trained on with any seed; about a fifth
of them (60 or so) are ``test``. The seed chooses the problems drawn, their order and the cases; past the
split's size, problems repeat in fresh permutations with new cases.
"""

from __future__ import annotations

import json
from typing import Any, Callable

import numpy as np

from armor_core import hookimpl
from armor_core.hookspecs import RegisterTask
from armor_plugins.tasks.arithmetic import split_of

__all__ = ["OPERATIONS", "generate_code_ops", "problems"]

_SPLITS = ("train", "test")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"

#: name -> (reference program with N for the number, numbers N, input kind, the computation)
OPERATIONS: dict[str, tuple[str, range, str, Callable[[Any, int], Any]]] = {
    "add": ("print(int(input())+N)", range(0, 100), "int", lambda x, n: x + n),
    "sub": ("print(int(input())-N)", range(0, 100), "int", lambda x, n: x - n),
    "times": ("print(int(input())*N)", range(0, 100), "int", lambda x, n: x * n),
    "first": ("print(input()[:N])", range(1, 21), "word", lambda s, n: s[:n]),
    "last": ("print(input()[-N:])", range(1, 21), "word", lambda s, n: s[-n:]),
    "repeat": ("print(input()*N)", range(1, 10), "word", lambda s, n: s * n),
}


def problems(split: str) -> list[tuple[str, int]]:
    """Every ``(operation, N)`` of one split, in a fixed order."""
    split_id = _SPLITS.index(split)
    out = []
    for code, (name, (_, numbers, _, _)) in enumerate(OPERATIONS.items()):
        ns = np.array(list(numbers), dtype=np.int64)
        # salted with 7 so that these problems hash apart from arithmetic's (a, b, op) ones
        keep = split_of(ns, np.full_like(ns, code), np.full_like(ns, 7)) == split_id
        out += [(name, int(n)) for n in ns[keep]]
    return out


def _case(kind: str, rng: np.random.Generator) -> Any:
    if kind == "int":
        return int(rng.integers(0, 100))
    return "".join(rng.choice(list(_LETTERS), size=int(rng.integers(3, 13))))


def _row(name: str, n: int, cases: int, rng: np.random.Generator) -> dict[str, Any]:
    template, _, kind, compute = OPERATIONS[name]
    inputs = []
    while len(inputs) < cases:  # distinct inputs: equal ones would test the program once
        x = _case(kind, rng)
        if x not in inputs:
            inputs.append(x)
    truth = {"inputs": [f"{x}\n" for x in inputs], "outputs": [f"{compute(x, n)}\n" for x in inputs]}
    return {
        "prompt": f"{name} {n}:",
        "data_source": "code",
        "ground_truth": json.dumps(truth),
        "response": template.replace("N", str(n)),
    }


def generate_code_ops(split: str, size: int, seed: int, *, cases: int = 3, **unknown: Any) -> list[dict[str, Any]]:
    """Rows ``{"prompt": "add 12:", "data_source": "code", "ground_truth": '{"inputs": ..., "outputs": ...}',
    "response": "print(int(input())+12)"}``.

    :param split: ``train`` or ``test`` (``val`` and ``validation`` mean ``test``).
    :param size: number of rows.
    :param seed: chooses the problems drawn from the split, their order and their cases.
    :param cases: stdin/stdout cases per row (at least 2, so that a program that ignores its input fails).
    """
    if unknown:
        raise TypeError(
            f"code_ops task: unknown parameter(s) {sorted(unknown)}; accepted: cases (set it in data.task_kwargs)"
        )
    split_key = {"val": "test", "validation": "test"}.get(split, split)
    if split_key not in _SPLITS:
        raise ValueError(f"code_ops task: split {split!r} is not one of 'train', 'test'")
    if not isinstance(cases, int) or not 2 <= cases <= 20:
        raise ValueError(f"code_ops task: cases={cases!r} must be an integer from 2 to 20")
    if size < 0:
        raise ValueError(f"code_ops task: size={size} must be >= 0")
    pool = problems(split_key)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, _SPLITS.index(split_key), 32])
    order = np.concatenate([rng.permutation(len(pool)) for _ in range(-(-size // len(pool)))])[:size] if size else []
    return [_row(*pool[int(i)], cases, rng) for i in order]


@hookimpl
def armor_register_tasks(register: RegisterTask) -> None:
    register("code_ops", generate_code_ops)
