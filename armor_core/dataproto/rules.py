"""The checks and merge rules behind ``DataProto``'s operations: key lookup with a suggestion for a
misspelt key, argument checks, column summaries for error messages, value equality that treats
NaN as equal to NaN, and how ``concat`` merges ``meta_info`` (metrics by ``merge_metrics``)."""

from __future__ import annotations

import difflib
import math
import reprlib
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import torch

from armor_core.dataproto.metrics import merge_metrics

if TYPE_CHECKING:
    from armor_core.dataproto.protocol import DataProto

__all__ = [
    "check_concat",
    "describe_tensor",
    "is_row_number",
    "key_list",
    "merge_meta",
    "pick",
    "positive_int",
    "rename_mapping",
    "replace_columns",
    "row_index",
    "same_value",
    "split_flat",
    "stack_rows",
    "summary",
    "unknown_key",
    "verl_key_args",
]

Keys = str | Sequence[str] | None


def key_list(keys: str | Sequence[str]) -> list[str]:
    return [keys] if isinstance(keys, str) else list(keys)


def pick(source: dict, keys: Keys, kind: str, op: str) -> dict:
    if keys is None:
        return dict(source)
    keys = key_list(keys)
    for key in keys:
        if key not in source:
            raise KeyError(f"DataProto.{op}: {unknown_key(kind, key, list(source))}")
    return {key: source[key] for key in keys}


VERL_KEY_ARGS = ("batch_keys", "non_tensor_batch_keys", "meta_info_keys")


def verl_key_args(op: str, given: dict[str, Any], armor_keys: tuple) -> tuple[bool, tuple]:
    """``(deepcopy, (tensor, non-tensor, meta keys))`` from verl's keyword arguments of ``select``/``pop``;
    mixing them with ARMOR's names, or an unknown name, is a TypeError naming both spellings."""
    unknown = sorted(set(given) - {*VERL_KEY_ARGS, *(("deepcopy",) if op == "select" else ())})
    if unknown:
        raise TypeError(
            f"DataProto.{op}: unknown argument {unknown[0]!r}; it takes tensor_keys, non_tensor_keys, meta_keys "
            f"(or verl's {', '.join(VERL_KEY_ARGS)})"
        )
    if any(k is not None for k in armor_keys):
        raise TypeError(
            f"DataProto.{op}: use ARMOR's names (tensor_keys, non_tensor_keys, meta_keys) or verl's "
            f"({', '.join(VERL_KEY_ARGS)}), not both in one call"
        )
    return bool(given.get("deepcopy", False)), tuple(given.get(k) for k in VERL_KEY_ARGS)


def unknown_key(kind: str, key: Any, available: list[str]) -> str:
    close = difflib.get_close_matches(str(key), available, n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"no {kind} {key!r}.{hint} Available: {', '.join(map(repr, available)) or 'none'}"


def replace_columns(target: dict, new: dict) -> None:
    """Swap a dict's contents while keeping its identity (callers may hold ``data.tensors``)."""
    new = dict(new)
    target.clear()
    target.update(new)


def positive_int(value: Any, op: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{op}: {name} must be a positive int, got {value!r}")
    return int(value)


def summary(col: Any) -> str:
    if isinstance(col, torch.Tensor):
        return f"{tuple(col.shape)} {str(col.dtype).replace('torch.', '')}" + (
            "" if col.device.type == "cpu" else f" on {col.device}"
        )
    return f"{col.shape} {col.dtype}" if isinstance(col, np.ndarray) else f"<{type(col).__name__}>"


def describe_tensor(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')} (*{''.join(f', {d}' for d in t.shape[1:])}) on {t.device}"


def same_value(a: Any, b: Any) -> bool:
    """Equal values, for union and concat: tensors and arrays elementwise, NaN equal to NaN."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or (a.dtype, a.shape) != (
            b.dtype,
            b.shape,
        ):
            return False
        a, b = a.detach().cpu(), b.detach().cpu()
        return torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        if a.dtype == object or b.dtype == object:
            return all(same_value(x, y) for x, y in zip(a.ravel(), b.ravel()))
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc" and b.dtype.kind in "fc"))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and type(a) is type(b):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def merge_meta(items: list[DataProto]) -> dict[str, Any]:
    ref = {k: v for k, v in items[0].meta_info.items() if k != "metrics"}
    for i, item in enumerate(items):
        if "metrics" in item.meta_info and not isinstance(item.meta_info["metrics"], Mapping):
            raise TypeError(
                f"DataProto.concat: item {i} meta_info['metrics'] is a {type(item.meta_info['metrics']).__name__}; "
                f"expected a dict of metric name -> value"
            )
        keys = item.meta_info.keys() - {"metrics"}
        if keys != ref.keys():
            raise ValueError(
                f"DataProto.concat: item {i} has meta_info keys {sorted(keys)} but item 0 has {sorted(ref)}; "
                f"apart from 'metrics', every item needs the same meta_info"
            )
        for key in keys:
            if not same_value(item.meta_info[key], ref[key]):
                raise ValueError(
                    f"DataProto.concat: meta_info[{key!r}] is {reprlib.repr(item.meta_info[key])} in item {i} "
                    f"but {reprlib.repr(ref[key])} in item 0"
                )
    if any("metrics" in item.meta_info for item in items):
        ref["metrics"] = merge_metrics(item.meta_info["metrics"] for item in items if "metrics" in item.meta_info)
    return ref


def is_row_number(index: Any) -> bool:
    """True for one row's number (a Python, numpy or 0-d tensor integer), which selects a row, not rows."""
    if isinstance(index, torch.Tensor):
        return index.ndim == 0 and not index.dtype.is_floating_point and index.dtype != torch.bool
    return isinstance(index, (int, np.integer)) and not isinstance(index, (bool, np.bool_))


def row_index(index: Any, n: int) -> slice | np.ndarray:
    """A row index into ``n`` rows as a slice (a view) or an int64 array of row numbers (a copy)."""
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer, slice, list, range, np.ndarray)):
        raise TypeError(
            f"DataProto: cannot index rows with {type(index).__name__}; use an int, a slice, "
            f"a list/array/tensor of ints or a boolean mask (or a str for a column)"
        )
    if isinstance(index, slice):  # torch has no negative steps: turn those into row numbers
        return index if (index.step or 1) > 0 else np.arange(n)[index]
    rows = np.asarray(index)
    if rows.ndim == 0 and rows.dtype.kind in "iu":
        i = int(rows)
        if not -n <= i < n:
            raise IndexError(f"DataProto: row {i} is out of range for batch size {n}")
        return slice(i % n, i % n + 1)
    if rows.ndim != 1:
        raise IndexError(f"DataProto: a row index must be 1-D, got shape {rows.shape}")
    if rows.dtype == np.bool_:
        if rows.shape[0] != n:
            raise IndexError(f"DataProto: boolean mask has {rows.shape[0]} entries but the batch has {n} rows")
        return np.flatnonzero(rows)
    if rows.size == 0:  # np.asarray([]) is float64: an empty list selects no row
        return np.zeros(0, dtype=np.int64)
    if rows.dtype.kind not in "iu":
        raise TypeError(f"DataProto: row indices must be integers or booleans, got dtype {rows.dtype}")
    bad = rows[(rows < -n) | (rows >= n)]
    if bad.size:
        raise IndexError(f"DataProto: row {bad[0]} is out of range for batch size {n}")
    return np.where(rows < 0, rows + n, rows).astype(np.int64)


def check_concat(items: Sequence[DataProto]) -> None:
    """Every item has item 0's columns, and each tensor its dtype, trailing shape and device."""
    first = items[0]
    for i, item in enumerate(items[1:], 1):
        for kind, mine, theirs in (
            ("tensor", first.tensors, item.tensors),
            ("non-tensor", first.non_tensors, item.non_tensors),
        ):
            if mine.keys() != theirs.keys():
                raise ValueError(
                    f"DataProto.concat: item {i} has different {kind} columns from item 0: missing "
                    f"{sorted(mine.keys() - theirs.keys())}, extra {sorted(theirs.keys() - mine.keys())}"
                )
        for key, t in item.tensors.items():
            ref = first.tensors[key]
            if (t.dtype, t.shape[1:], t.device) != (ref.dtype, ref.shape[1:], ref.device):
                raise ValueError(
                    f"DataProto.concat: tensor {key!r} is {describe_tensor(t)} in item {i} but "
                    f"{describe_tensor(ref)} in item 0"
                )


def split_flat(data: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``from_single_dict``: torch tensors to tensor columns, numpy arrays/lists/tuples to non-tensor columns."""
    tensors, non_tensors = {}, {}
    for key, value in data.items():
        if isinstance(value, torch.Tensor):
            tensors[key] = value
        elif isinstance(value, (np.ndarray, list, tuple)):
            non_tensors[key] = value
        else:
            raise TypeError(
                f"DataProto.from_single_dict: {key!r} is a {type(value).__name__}; expected a torch.Tensor "
                f"or a numpy array / list with one entry per row (pass per-batch values as meta_info)"
            )
    return tensors, non_tensors


def stack_rows(items: list) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray], dict[str, Any]]:
    """``concat``'s columns and meta_info, after ``check_concat``."""
    check_concat(items)
    first = items[0]
    non_tensors = {}
    for key in first.non_tensors:
        try:
            non_tensors[key] = np.concatenate([item.non_tensors[key] for item in items])
        except ValueError as e:
            shapes = [item.non_tensors[key].shape for item in items]
            raise ValueError(f"DataProto.concat: non-tensor {key!r} cannot be stacked (shapes {shapes}): {e}") from None
    tensors = {key: torch.cat([item.tensors[key] for item in items]) for key in first.tensors}
    return tensors, non_tensors, merge_meta(items)


def rename_mapping(old: list[str], new: list[str], columns: list[str]) -> dict[str, str]:
    """``rename``'s old -> new names, checked before anything is renamed."""
    if len(old) != len(new):
        raise ValueError(f"DataProto.rename: {len(old)} old names {old} but {len(new)} new names {new}")
    for names in (old, new):
        if len(set(names)) != len(names):
            raise ValueError(f"DataProto.rename: duplicate name in {names}")
    for key in old:
        if key not in columns:
            raise KeyError(unknown_key("column", key, columns))
    clash = [k for k in new if k in columns and k not in old]
    if clash:
        raise ValueError(f"DataProto.rename: {clash[0]!r} is already a column; pop it first or choose another name")
    return dict(zip(old, new))
