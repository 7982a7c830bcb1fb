"""The built-in ``arithmetic`` task: procedurally generated problems like ``"12+34="`` -> ``"46"``.

It is the default dataset of ``armor run`` because a ~1M-parameter model can learn it on a CPU in
seconds, and its reward is exact (the ``arithmetic`` reward domain, ``armor_plugins/rewards/arithmetic.py``,
compares integers), so the before/after accuracy of an RL run measures the algorithm, not a judge.

Train/test separation does not depend on the seed: every problem ``(a, op, b)`` is assigned to a
split by a fixed integer hash, so ``train`` rows made with any seed never appear in ``test`` rows
made with any other seed. The seed only chooses which problems of the split are drawn and their
order. Problems are distinct within a call while the split has enough of them; past that, the
split is cycled in fresh permutations (a small ``digits=1`` task has only ~20 test problems).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from armor_core import hookimpl
from armor_core.hookspecs import RegisterTask

__all__ = ["TEST_FRACTION", "generate_arithmetic", "split_of"]

#: share of all (a, op, b) problems that belongs to the test split. 2-digit addition has
#: 90 * 90 = 8100 problems, so the test split holds ~1620 (the spec asks for >= 500).
TEST_FRACTION = 0.2
_SPLITS = ("train", "test")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
# above this many problems we sample instead of enumerating (3-digit, one op: 810,000)
_ENUMERATE_LIMIT = 1_000_000
_U64 = np.uint64


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (Steele et al., 2014): a bijective uint64 -> uint64 avalanche hash."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> _U64(30))
        x = x * _U64(0xBF58476D1CE4E5B9)
        x = x ^ (x >> _U64(27))
        x = x * _U64(0x94D049BB133111EB)
        return x ^ (x >> _U64(31))


def split_of(a: np.ndarray, b: np.ndarray, op_index: np.ndarray) -> np.ndarray:
    """Which split each problem belongs to: 0 = train, 1 = test. Shapes: (n,) int -> (n,) int8.

    Uses only the operands and the operator, never the seed or the other task parameters, which
    is what makes the two splits disjoint across any seeds and sizes.
    """
    key = (
        (np.asarray(a, dtype=np.int64).astype(_U64) << _U64(34))
        ^ (np.asarray(b, dtype=np.int64).astype(_U64) << _U64(2))
        ^ np.asarray(op_index, dtype=np.int64).astype(_U64)
    )
    h = _mix64(key)
    # the top 53 bits as a uniform float in [0, 1)
    u = (h >> _U64(11)).astype(np.float64) / float(1 << 53)
    return (u < TEST_FRACTION).astype(np.int8)


def _operand_range(digits: int) -> tuple[int, int]:
    """Operands with exactly ``digits`` digits (1 digit: 0..9)."""
    if digits == 1:
        return 0, 9
    return 10 ** (digits - 1), 10**digits - 1


def _draw(
    split_id: int, size: int, rng: np.random.Generator, lo: int, hi: int, op_codes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``size`` problems of one split as (a, b, index into op_codes), each (size,) int64.

    ``op_codes`` are the operators' fixed codes (their position in ``_OPS``), so a problem hashes
    the same whatever other operators are enabled.
    """
    n_ops = len(op_codes)
    span = hi - lo + 1
    total = span * span * n_ops
    if total <= _ENUMERATE_LIMIT:
        flat = np.arange(total, dtype=np.int64)
        op, rest = flat // (span * span), flat % (span * span)
        a, b = lo + rest // span, lo + rest % span
        keep = split_of(a, b, op_codes[op]) == split_id
        a, b, op = a[keep], b[keep], op[keep]
        if len(a) == 0:
            raise ValueError(
                f"arithmetic task: the {_SPLITS[split_id]} split is empty for operands {lo}..{hi}; use more digits"
            )
        order = np.concatenate([rng.permutation(len(a)) for _ in range(-(-size // len(a)))])[:size]
        return a[order], b[order], op[order]
    # too many problems to enumerate: rejection-sample distinct problems of this split
    seen: set[tuple[int, int, int]] = set()
    out: list[tuple[int, int, int]] = []
    while len(out) < size:
        n = 2 * (size - len(out)) + 64
        a, b, op = rng.integers(lo, hi + 1, n), rng.integers(lo, hi + 1, n), rng.integers(0, n_ops, n)
        for x, y, o, s in zip(a.tolist(), b.tolist(), op.tolist(), split_of(a, b, op_codes[op]).tolist()):
            if s == split_id and (x, y, o) not in seen:
                seen.add((x, y, o))
                out.append((x, y, o))
                if len(out) == size:
                    break
    arr = np.array(out, dtype=np.int64).reshape(-1, 3)
    return arr[:, 0], arr[:, 1], arr[:, 2]


def generate_arithmetic(
    split: str, size: int, seed: int, *, digits: int = 2, ops: str = "+", **unknown: Any
) -> list[dict[str, Any]]:
    """Rows ``{"prompt": "12+34=", "data_source": "arithmetic", "ground_truth": "46"}``.

    :param split: ``train`` or ``test`` (``val`` and ``validation`` mean ``test``).
    :param size: number of rows.
    :param seed: chooses the problems drawn from the split and their order.
    :param digits: digits of each operand (2: 10..99).
    :param ops: operators to use, any of ``+ - *`` (``"+-"`` mixes addition and subtraction);
        subtraction can give a negative ground truth such as ``"-7"``.
    """
    if unknown:
        raise TypeError(
            f"arithmetic task: unknown parameter(s) {sorted(unknown)}; accepted: digits, ops (set them in "
            "data.task_kwargs)"
        )
    split_key = {"val": "test", "validation": "test"}.get(split, split)
    if split_key not in _SPLITS:
        raise ValueError(f"arithmetic task: split {split!r} is not one of 'train', 'test'")
    if not isinstance(digits, int) or not 1 <= digits <= 9:
        raise ValueError(f"arithmetic task: digits={digits!r} must be an integer from 1 to 9")
    op_list = list(dict.fromkeys(ops))  # keep order, drop repeats
    bad = [o for o in op_list if o not in _OPS]
    if not op_list or bad:
        raise ValueError(f"arithmetic task: ops={ops!r} must be made of {''.join(_OPS)} (e.g. '+' or '+-')")
    if size < 0:
        raise ValueError(f"arithmetic task: size={size} must be >= 0")
    if size == 0:
        return []
    split_id = _SPLITS.index(split_key)
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, split_id, digits])
    lo, hi = _operand_range(digits)
    op_codes = np.array([list(_OPS).index(o) for o in op_list], dtype=np.int64)
    a, b, op = _draw(split_id, size, rng, lo, hi, op_codes)
    rows = []
    for x, y, o in zip(a.tolist(), b.tolist(), op.tolist()):
        sym = op_list[o]
        rows.append({"prompt": f"{x}{sym}{y}=", "data_source": "arithmetic", "ground_truth": str(_OPS[sym](x, y))})
    return rows


@hookimpl
def armor_register_tasks(register: RegisterTask) -> None:
    register("arithmetic", generate_arithmetic)
