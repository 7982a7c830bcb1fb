"""DataProto: one batch of rows, as torch tensors, numpy columns and run-level ``meta_info``.

Every stage (dataset, rollout, reward, advantage, update) and every Ray worker passes a batch as
a DataProto. A row is one sample; a column is a ``tensors`` entry (``torch.Tensor``, dim 0 = rows)
or a ``non_tensors`` entry (``np.ndarray``, often ``dtype=object`` for strings or dicts, dim 0 =
rows); ``meta_info`` is a plain dict about the whole batch (temperature, metrics, ...). Every
column has the same number of rows; that is checked on construction and after every operation,
and the error names the offending key and both sizes.

Semantics, chosen to match torch and numpy where they have an answer:

- Rows: ``data[i]`` is a DataProto of batch size 1 (never a bare row), ``data[a:b]`` and
  ``chunk``/``split``/``unpad`` are views (writing into their tensors writes into the parent),
  while index arrays, boolean masks, ``repeat``, ``pad_to_divisor`` and ``concat`` copy.
- ``data["key"]`` is the column itself (tensor or array, not a copy); ``data["key"] = column``
  adds or replaces one, checking its length.
- ``meta_info`` is copied shallowly into every derived DataProto: adding a key to a slice's
  meta_info does not touch the parent, but a nested dict (``meta_info["metrics"]``) is shared.
- In place (and returning ``self`` so both ``data.union(x)`` and ``data = data.union(x)`` work):
  ``union``, ``rename``, ``reorder``, ``pop`` (which returns what it removed), item assignment.
  Everything else returns a new DataProto and leaves ``self`` alone. A failing in-place operation
  leaves ``self`` unchanged.

Files and pickling live in ``armor_core.protocol_io``: ``save``/``load`` use safetensors and
JSON, never pickle, so loading a file cannot run code; pickling (what Ray does between processes)
ships each tensor's own bytes as one out-of-band buffer and unpickles onto the CPU.
"""

from __future__ import annotations

import copy
import difflib
import math
import reprlib
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence, Union

import numpy as np
import torch

from armor_core import protocol_io
from armor_core.protocol_io import as_array as _as_array

__all__ = ["DataProto"]

Index = Union[int, slice, Sequence[int], Sequence[bool], np.ndarray, torch.Tensor]
Keys = Union[str, Sequence[str], None]


class DataProto:
    """A batch: ``tensors`` and ``non_tensors`` columns of ``batch_size`` rows, plus ``meta_info``.

    :param tensors: name -> ``torch.Tensor`` of shape ``(batch_size, ...)``.
    :param non_tensors: name -> ``np.ndarray`` of shape ``(batch_size, ...)``; a list is turned
        into a 1-D object array (element by element, so a list of lists stays one list per row).
    :param meta_info: anything about the whole batch; shallow-copied.

    A DataProto with no column has batch size 0.
    """

    __slots__ = ("tensors", "non_tensors", "meta_info")

    def __init__(self, tensors: Mapping[str, torch.Tensor] | None = None, non_tensors: Mapping[str, Any] | None = None,
                 meta_info: Mapping[str, Any] | None = None) -> None:
        for name, arg in (("tensors", tensors), ("non_tensors", non_tensors), ("meta_info", meta_info)):
            if arg is not None and not isinstance(arg, Mapping):
                raise TypeError(f"DataProto: {name} must be a dict, got {type(arg).__name__}")
        self.tensors: dict[str, torch.Tensor] = dict(tensors or {})
        self.non_tensors: dict[str, np.ndarray] = {k: _as_array(v) for k, v in (non_tensors or {}).items()}
        self.meta_info: dict[str, Any] = dict(meta_info or {})
        self._check()

    @classmethod
    def from_dict(cls, tensors: Mapping[str, torch.Tensor] | None = None, non_tensors: Mapping[str, Any] | None = None,
                  meta_info: Mapping[str, Any] | None = None) -> "DataProto":
        """Same as the constructor, spelled as in verl."""
        return cls(tensors, non_tensors, meta_info)

    @classmethod
    def from_single_dict(cls, data: Mapping[str, Any], meta_info: Mapping[str, Any] | None = None) -> "DataProto":
        """Split one flat dict: torch tensors become ``tensors``, numpy arrays/lists/tuples ``non_tensors``."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, (np.ndarray, list, tuple)):
                non_tensors[key] = value
            else:
                raise TypeError(f"DataProto.from_single_dict: {key!r} is a {type(value).__name__}; expected a torch.Tensor "
                                f"or a numpy array / list with one entry per row (pass per-batch values as meta_info)")
        return cls(tensors, non_tensors, meta_info)

    # -- validation and basic access ---------------------------------------------------------

    def _check(self, where: str = "DataProto") -> int:
        """Check types and that every column has the same number of rows; return that number."""
        ref = None
        for kind, columns, expected in (("tensor", self.tensors, torch.Tensor), ("non-tensor", self.non_tensors, np.ndarray)):
            for key, col in columns.items():
                if not isinstance(key, str):
                    raise TypeError(f"{where}: column names must be str, got {key!r} ({type(key).__name__})")
                if not isinstance(col, expected):
                    hint = ("pass it in non_tensors or convert it with torch.as_tensor" if kind == "tensor"
                            else "pass it in tensors" if isinstance(col, torch.Tensor) else "use a numpy array or a list")
                    raise TypeError(f"{where}: {kind} {key!r} is a {type(col).__name__}; "
                                    f"expected {expected.__module__}.{expected.__name__} ({hint})")
                if col.ndim == 0:
                    raise ValueError(f"{where}: {kind} {key!r} is 0-dimensional; a column needs a leading batch dimension "
                                     f"(put a per-batch value in meta_info)")
                if ref is None:
                    ref = (kind, key, col.shape[0])
                elif col.shape[0] != ref[2]:
                    size = "batch size" if kind == "tensor" else "length"
                    raise ValueError(f"{where}: {kind} {key!r} has {size} {col.shape[0]} but {ref[0]} {ref[1]!r} has {ref[2]} "
                                     f"(every column must have one entry per row)")
        both = self.tensors.keys() & self.non_tensors.keys()
        if both:
            raise ValueError(f"{where}: {sorted(both)[0]!r} is both a tensor and a non-tensor column; names must be unique")
        return 0 if ref is None else ref[2]

    @property
    def batch_size(self) -> int:
        """Number of rows (0 when there is no column)."""
        return self._check()

    def __len__(self) -> int:
        return self._check()

    def keys(self) -> list[str]:
        """Column names: tensor columns first, then non-tensor columns (meta_info keys are not columns)."""
        return [*self.tensors, *self.non_tensors]

    def __contains__(self, key: object) -> bool:
        """True when ``key`` is a tensor or non-tensor column (not a meta_info key)."""
        return key in self.tensors or key in self.non_tensors

    def __iter__(self) -> Iterator["DataProto"]:
        """Rows, each as a DataProto of batch size 1 (use ``keys()`` for the column names)."""
        return (self[i] for i in range(len(self)))

    def __getitem__(self, index: str | Index) -> Any:
        """``data["key"]``: the column. Otherwise rows: an int gives a DataProto of batch size 1
        and a slice a DataProto, both views; a list/array/tensor of ints (in that order, repeats
        allowed) or a boolean mask (numpy, torch or list, one entry per row) gives a copy."""
        if isinstance(index, str):
            if index in self.tensors:
                return self.tensors[index]
            if index in self.non_tensors:
                return self.non_tensors[index]
            raise KeyError(_unknown("column", index, self.keys()))
        return self._take(self._rows(index))

    def __setitem__(self, key: str, value: Any) -> None:
        """Add or replace one column: a ``torch.Tensor`` goes to ``tensors``, an array or list to
        ``non_tensors``. Its length must match the batch unless it is the only column."""
        if not isinstance(key, str):
            raise TypeError(f"DataProto[...] = value takes a column name (str), got {type(key).__name__}; "
                            f"to change rows, write into a column: data['name'][rows] = ...")
        is_tensor = isinstance(value, torch.Tensor)
        target, other = (self.tensors, self.non_tensors) if is_tensor else (self.non_tensors, self.tensors)
        if key in other:
            raise ValueError(f"DataProto[{key!r}] = ...: {key!r} is already a {'non-tensor' if is_tensor else 'tensor'} "
                             f"column; `del data[{key!r}]` first to change its kind")
        old = target.get(key, _MISSING)
        target[key] = value if is_tensor else _as_array(value)
        try:
            self._check(f"DataProto[{key!r}] = ...")
        except (TypeError, ValueError):
            if old is _MISSING:
                del target[key]
            else:
                target[key] = old
            raise

    def __delitem__(self, key: str) -> None:
        if key in self.tensors:
            del self.tensors[key]
        elif key in self.non_tensors:
            del self.non_tensors[key]
        else:
            raise KeyError(_unknown("column", key, self.keys()))

    # -- rows ----------------------------------------------------------------------------------

    def _rows(self, index: Index) -> slice | np.ndarray:
        """Normalise a row index to a slice (view) or an int64 array of row numbers (copy)."""
        n = len(self)
        if isinstance(index, torch.Tensor):
            index = index.detach().cpu().numpy()
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer, slice, list, range, np.ndarray)):
            raise TypeError(f"DataProto: cannot index rows with {type(index).__name__}; use an int, a slice, "
                            f"a list/array/tensor of ints or a boolean mask (or a str for a column)")
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

    def _take(self, rows: slice | np.ndarray) -> "DataProto":
        if isinstance(rows, slice):
            tensors = {k: v[rows] for k, v in self.tensors.items()}
        else:
            index = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
            tensors = {k: v[index.to(v.device)] for k, v in self.tensors.items()}
        return DataProto(tensors, {k: v[rows] for k, v in self.non_tensors.items()}, self.meta_info)

    def chunk(self, n: int) -> list["DataProto"]:
        """``n`` consecutive views; with ``len(self) = q*n + r`` the first ``r`` chunks get
        ``q + 1`` rows and the rest ``q`` (numpy's ``array_split``; 10 rows in 4 -> 3, 3, 2, 2).
        ``n > len(self)`` is an error (a worker would get an empty batch): ``pad_to_divisor`` first."""
        n, size = _positive_int(n, "DataProto.chunk", "n"), len(self)
        if n > max(size, 1):
            raise ValueError(f"DataProto.chunk({n}) of a batch of {size} rows would leave {n - size} chunks empty; "
                             f"call pad_to_divisor({n}) first or use at most {size} chunks")
        q, r = divmod(size, n)
        bounds = np.cumsum([0] + [q + (i < r) for i in range(n)])
        return [self[int(a):int(b)] for a, b in zip(bounds[:-1], bounds[1:])]

    def split(self, size: int) -> list["DataProto"]:
        """Consecutive views of ``size`` rows, the last one shorter when ``size`` does not divide
        the batch (``torch.split``); an empty batch gives an empty list."""
        size = _positive_int(size, "DataProto.split", "size")
        return [self[i:i + size] for i in range(0, len(self), size)]

    def repeat(self, n: int, interleave: bool = True) -> "DataProto":
        """Each row ``n`` times: rows [a, b] give [a, a, b, b] when ``interleave`` (how GRPO lays
        out a group of samples per prompt), [a, b, a, b] otherwise. Copies."""
        n, rows = _positive_int(n, "DataProto.repeat", "n"), np.arange(len(self))
        return self._take(np.repeat(rows, n) if interleave else np.tile(rows, n))

    def reorder(self, indices: Index) -> "DataProto":
        """Permute the rows in place (row ``i`` becomes old row ``indices[i]``); returns ``self``.
        ``indices`` must use every row once; to select or duplicate rows use ``data[indices]``."""
        rows, n = self._rows(indices), len(self)
        rows = np.arange(n)[rows] if isinstance(rows, slice) else rows
        if rows.shape[0] != n or not np.array_equal(np.sort(rows), np.arange(n)):
            raise ValueError(f"DataProto.reorder needs a permutation of the {n} rows (each exactly once), got "
                             f"{reprlib.repr(rows.tolist())}; use data[indices] to select or duplicate rows")
        reordered = self._take(rows)
        _replace(self.tensors, reordered.tensors)
        _replace(self.non_tensors, reordered.non_tensors)
        return self

    def pad_to_divisor(self, k: int) -> tuple["DataProto", int]:
        """Append copies of the first rows (cycling when ``k`` exceeds the batch) until the batch
        size is a multiple of ``k``; return ``(padded, pad_size)``. Padded rows are real samples,
        so a worker computes on valid data; ``unpad(pad_size)`` drops them afterwards."""
        k, n = _positive_int(k, "DataProto.pad_to_divisor", "k"), len(self)
        pad = -n % k
        if pad == 0:
            return self._take(slice(None)), 0
        return self._take(np.concatenate([np.arange(n), np.arange(pad) % n])), pad

    def unpad(self, pad_size: int) -> "DataProto":
        """A view without the last ``pad_size`` rows (the inverse of ``pad_to_divisor``)."""
        n = len(self)
        if isinstance(pad_size, bool) or not isinstance(pad_size, (int, np.integer)) or not 0 <= pad_size <= n:
            raise ValueError(f"DataProto.unpad: pad_size must be an int in [0, {n}] for a batch of {n} rows, got {pad_size!r}")
        return self[: n - int(pad_size)]

    @staticmethod
    def concat(items: Sequence["DataProto"]) -> "DataProto":
        """Stack batches row-wise (copies). Every item needs the same columns, with the same
        dtype, trailing shape and device per tensor. ``meta_info["metrics"]`` (a dict of name ->
        value per item, e.g. one per worker) becomes name -> list of values in item order (an
        item without a name adds nothing to its list); every other meta_info key must be present
        with an equal value in every item."""
        items = list(items)
        if not items:
            raise ValueError("DataProto.concat: got an empty list; there is nothing to concatenate")
        for i, item in enumerate(items):
            if not isinstance(item, DataProto):
                raise TypeError(f"DataProto.concat: item {i} is a {type(item).__name__}; expected DataProto")
        first = items[0]
        for i, item in enumerate(items[1:], 1):
            for kind, mine, theirs in (("tensor", first.tensors, item.tensors), ("non-tensor", first.non_tensors, item.non_tensors)):
                if mine.keys() != theirs.keys():
                    raise ValueError(f"DataProto.concat: item {i} has different {kind} columns from item 0: missing "
                                     f"{sorted(mine.keys() - theirs.keys())}, extra {sorted(theirs.keys() - mine.keys())}")
            for key, t in item.tensors.items():
                ref = first.tensors[key]
                if (t.dtype, t.shape[1:], t.device) != (ref.dtype, ref.shape[1:], ref.device):
                    raise ValueError(f"DataProto.concat: tensor {key!r} is {_describe(t)} in item {i} but {_describe(ref)} in item 0")
        non_tensors = {}
        for key in first.non_tensors:
            try:
                non_tensors[key] = np.concatenate([item.non_tensors[key] for item in items])
            except ValueError as e:
                shapes = [item.non_tensors[key].shape for item in items]
                raise ValueError(f"DataProto.concat: non-tensor {key!r} cannot be stacked (shapes {shapes}): {e}") from None
        tensors = {key: torch.cat([item.tensors[key] for item in items]) for key in first.tensors}
        return DataProto(tensors, non_tensors, _merge_meta(items))

    # -- columns -------------------------------------------------------------------------------

    def select(self, tensor_keys: Keys = None, non_tensor_keys: Keys = None, meta_keys: Keys = None) -> "DataProto":
        """A DataProto with exactly the named columns (an omitted column argument names none, so
        ``select(tensor_keys=["input_ids"])`` has no non-tensor), and all of meta_info unless
        ``meta_keys`` names some. A str is one key. The columns are shared, not copied."""
        picked = [_pick(src, [] if keys is None and kind != "meta_info key" else keys, kind, "select")
                  for src, keys, kind in self._kinds(tensor_keys, non_tensor_keys, meta_keys)]
        return DataProto(*picked)

    def pop(self, tensor_keys: Keys = None, non_tensor_keys: Keys = None, meta_keys: Keys = None) -> "DataProto":
        """Remove the named keys from ``self`` and return them as a DataProto (an omitted argument
        names none, meta_info included). Every key is checked before anything is removed."""
        kinds = [(src, [] if keys is None else keys, kind) for src, keys, kind in self._kinds(tensor_keys, non_tensor_keys, meta_keys)]
        picked = [_pick(src, keys, kind, "pop") for src, keys, kind in kinds]
        for (src, _, _), removed in zip(kinds, picked):
            for key in removed:
                del src[key]
        return DataProto(*picked)

    def _kinds(self, tensor_keys: Keys, non_tensor_keys: Keys, meta_keys: Keys) -> list[tuple[dict, Keys, str]]:
        return [(self.tensors, tensor_keys, "tensor"), (self.non_tensors, non_tensor_keys, "non-tensor"),
                (self.meta_info, meta_keys, "meta_info key")]

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> "DataProto":
        """Rename columns in place (tensor or non-tensor, wherever each lives); returns ``self``.
        Swaps such as ``rename(["a", "b"], ["b", "a"])`` work; renaming onto another existing
        column is an error."""
        old, new = _key_list(old_keys), _key_list(new_keys)
        if len(old) != len(new):
            raise ValueError(f"DataProto.rename: {len(old)} old names {old} but {len(new)} new names {new}")
        for names in (old, new):
            if len(set(names)) != len(names):
                raise ValueError(f"DataProto.rename: duplicate name in {names}")
        for key in old:
            if key not in self:
                raise KeyError(_unknown("column", key, self.keys()))
        clash = [k for k in new if k in self and k not in old]
        if clash:
            raise ValueError(f"DataProto.rename: {clash[0]!r} is already a column; pop it first or choose another name")
        mapping = dict(zip(old, new))
        for columns in (self.tensors, self.non_tensors):
            _replace(columns, {mapping.get(k, k): v for k, v in columns.items()})
        return self

    def union(self, other: "DataProto") -> "DataProto":
        """Add ``other``'s columns and meta_info to ``self`` in place; returns ``self``. A key in
        both must hold equal values (then ``self``'s is kept); a different value is an error
        naming the key: nothing is ever silently dropped."""
        if not isinstance(other, DataProto):
            raise TypeError(f"DataProto.union: expected a DataProto, got {type(other).__name__}")
        n, m = len(self), len(other)
        if self.keys() and other.keys() and n != m:
            raise ValueError(f"DataProto.union: batch sizes differ ({n} rows in self, {m} in other)")
        for key in (self.tensors.keys() & other.non_tensors.keys()) | (self.non_tensors.keys() & other.tensors.keys()):
            raise ValueError(f"DataProto.union: {key!r} is a tensor column in one batch and a non-tensor column in the other")
        for mine, theirs, kind in ((self.tensors, other.tensors, "tensor"), (self.non_tensors, other.non_tensors, "non-tensor"),
                                   (self.meta_info, other.meta_info, "meta_info key")):
            for key, value in theirs.items():
                if key in mine and not _same(mine[key], value):
                    raise ValueError(f"DataProto.union: {kind} {key!r} differs between the two batches; "
                                     f"rename or pop one of them first")
        for mine, theirs in ((self.tensors, other.tensors), (self.non_tensors, other.non_tensors), (self.meta_info, other.meta_info)):
            for key, value in theirs.items():
                mine.setdefault(key, value)
        return self

    def to(self, device: str | torch.device, non_blocking: bool = False) -> "DataProto":
        """A DataProto whose tensors are on ``device`` (non-tensors and meta_info are shared)."""
        return DataProto({k: v.to(device, non_blocking=non_blocking) for k, v in self.tensors.items()}, self.non_tensors, self.meta_info)

    # -- files, pickling, display ---------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Write one safetensors file: tensors and numeric non-tensors as safetensors tensors,
        string/object non-tensors and meta_info as JSON. Anything JSON would not give back
        unchanged (a tuple, a numpy scalar, a nested array) is refused, naming where it is."""
        protocol_io.save(self, path)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> "DataProto":
        """Read a file written by ``save``; tensors are placed on ``device``. Never unpickles."""
        return cls(*protocol_io.load(path, device))

    def __getstate__(self) -> dict[str, Any]:
        return protocol_io.to_state(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.tensors, self.non_tensors, self.meta_info = protocol_io.from_state(state)
        self._check("DataProto (unpickled)")

    def __copy__(self) -> "DataProto":
        return DataProto(self.tensors, self.non_tensors, self.meta_info)

    def __deepcopy__(self, memo: dict) -> "DataProto":
        return DataProto(*(copy.deepcopy(d, memo) for d in (self.tensors, self.non_tensors, self.meta_info)))

    def __repr__(self) -> str:
        try:
            size: Any = len(self)
        except (TypeError, ValueError):  # repr must work on the broken batch an error is about
            size = "invalid"
        lines = [f"DataProto(batch_size={size}"]
        lines += [f"  tensor     {key}: {_summary(col)}" for key, col in self.tensors.items()]
        lines += [f"  non_tensor {key}: {_summary(col)}" for key, col in self.non_tensors.items()]
        return "\n".join(lines + [f"  meta_info  {list(self.meta_info)})"])


# -- helpers -------------------------------------------------------------------------------------

_MISSING = object()


def _key_list(keys: str | Sequence[str]) -> list[str]:
    return [keys] if isinstance(keys, str) else list(keys)


def _pick(source: dict, keys: Keys, kind: str, op: str) -> dict:
    if keys is None:
        return dict(source)
    keys = _key_list(keys)
    for key in keys:
        if key not in source:
            raise KeyError(f"DataProto.{op}: {_unknown(kind, key, list(source))}")
    return {key: source[key] for key in keys}


def _unknown(kind: str, key: Any, available: list[str]) -> str:
    close = difflib.get_close_matches(str(key), available, n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"no {kind} {key!r}.{hint} Available: {', '.join(map(repr, available)) or 'none'}"


def _replace(target: dict, new: dict) -> None:
    """Swap a dict's contents while keeping its identity (callers may hold ``data.tensors``)."""
    new = dict(new)
    target.clear()
    target.update(new)


def _positive_int(value: Any, op: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{op}: {name} must be a positive int, got {value!r}")
    return int(value)


def _summary(col: Any) -> str:
    if isinstance(col, torch.Tensor):
        return f"{tuple(col.shape)} {str(col.dtype).replace('torch.', '')}" + ("" if col.device.type == "cpu" else f" on {col.device}")
    return f"{col.shape} {col.dtype}" if isinstance(col, np.ndarray) else f"<{type(col).__name__}>"


def _describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')} (*{''.join(f', {d}' for d in t.shape[1:])}) on {t.device}"


def _same(a: Any, b: Any) -> bool:
    """Equal values, for union and concat: tensors and arrays elementwise, NaN equal to NaN."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or (a.dtype, a.shape) != (b.dtype, b.shape):
            return False
        a, b = a.detach().cpu(), b.detach().cpu()
        return torch.equal(a, b) or (a.is_floating_point() and torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        if a.dtype == object or b.dtype == object:
            return all(_same(x, y) for x, y in zip(a.ravel(), b.ravel()))
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc" and b.dtype.kind in "fc"))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and type(a) is type(b):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


def _merge_meta(items: list[DataProto]) -> dict[str, Any]:
    ref = {k: v for k, v in items[0].meta_info.items() if k != "metrics"}
    metrics: dict[str, list] = {}
    for i, item in enumerate(items):
        if "metrics" in item.meta_info:
            if not isinstance(item.meta_info["metrics"], Mapping):
                raise TypeError(f"DataProto.concat: item {i} meta_info['metrics'] is a {type(item.meta_info['metrics']).__name__}; "
                                f"expected a dict of metric name -> value")
            for name, value in item.meta_info["metrics"].items():
                metrics.setdefault(name, []).append(value)
        keys = item.meta_info.keys() - {"metrics"}
        if keys != ref.keys():
            raise ValueError(f"DataProto.concat: item {i} has meta_info keys {sorted(keys)} but item 0 has {sorted(ref)}; "
                             f"apart from 'metrics', every item needs the same meta_info")
        for key in keys:
            if not _same(item.meta_info[key], ref[key]):
                raise ValueError(f"DataProto.concat: meta_info[{key!r}] is {reprlib.repr(item.meta_info[key])} in item {i} "
                                 f"but {reprlib.repr(ref[key])} in item 0")
    if any("metrics" in item.meta_info for item in items):
        ref["metrics"] = metrics
    return ref
