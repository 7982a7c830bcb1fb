"""DataProto: one batch of rows, as torch tensors, numpy columns and run-level ``meta_info``.

Every stage (dataset, rollout, reward, advantage, update) and every Ray worker passes a batch as
a DataProto. A row is one sample; a column is a ``tensors`` entry (``torch.Tensor``, dim 0 = rows)
or a ``non_tensors`` entry (``np.ndarray``, often ``dtype=object`` for strings or dicts, dim 0 =
rows); ``meta_info`` is a plain dict about the whole batch (temperature, metrics, ...). Every
column has the same number of rows; that is checked on construction and after every operation,
and the error names the offending key and both sizes.

Semantics, chosen to match torch and numpy where they have an answer:

- Rows: ``data[i]`` is the row, a ``DataProtoItem`` without the batch dimension (as torch and verl
  index); ``data[i:i + 1]`` is a DataProto of batch size 1. ``data[a:b]`` and
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
- verl's names: ``data.batch`` and ``data.non_tensor_batch`` are ``tensors`` and ``non_tensors``
  (the same dicts), and ``from_dict``, ``union``, ``chunk``, ``concat``, ``reorder``, ``rename``
  are spelled as in verl, and ``data[i]`` is verl's ``DataProtoItem``. ``select``/``pop`` also take
  verl's ``batch_keys``/``non_tensor_batch_keys``/``meta_info_keys`` (with verl's meaning: an
  omitted one keeps every key of its kind) and ``repeat`` verl's ``repeat_times``.

Files and pickling live in ``armor_core.dataproto.io``: ``save``/``load`` use safetensors and
JSON, never pickle, so loading a file cannot run code; pickling (what Ray does between processes)
ships each tensor's own bytes as one out-of-band buffer and unpickles onto the CPU.

Long module: ``DataProto`` is one class whose surface is verl's (``select``, ``pop``, ``union``, ``chunk``, ``concat``,
``repeat``, ...); its row item, rules and files are modules of their own (``item``, ``rules``, ``io``).
"""

from __future__ import annotations

import copy
import reprlib
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence, overload

import numpy as np
import torch

from armor_core.dataproto import io as protocol_io
from armor_core.dataproto.io import as_array as _as_array
from armor_core.dataproto.item import DataProtoItem
from armor_core.dataproto.rules import (
    Keys,
    is_row_number,
    key_list,
    pick,
    positive_int,
    rename_mapping,
    replace_columns,
    row_index,
    same_value,
    split_flat,
    stack_rows,
    summary,
    unknown_key,
    verl_key_args,
)

__all__ = ["DataProto", "DataProtoItem"]

Index = int | np.integer | slice | Sequence[int] | Sequence[bool] | np.ndarray | torch.Tensor
_MISSING = object()


def _fill_missing(mine: dict[str, Any], theirs: Mapping[str, Any]) -> None:
    """``mine[key] = value`` for each of ``theirs`` that ``mine`` lacks."""
    for key, value in theirs.items():
        mine.setdefault(key, value)


class DataProto:
    """A batch: ``tensors`` and ``non_tensors`` columns of ``batch_size`` rows, plus ``meta_info``.

    :param tensors: name -> ``torch.Tensor`` of shape ``(batch_size, ...)``.
    :param non_tensors: name -> ``np.ndarray`` of shape ``(batch_size, ...)``; a list is turned
        into a 1-D object array (element by element, so a list of lists stays one list per row).
    :param meta_info: anything about the whole batch; shallow-copied.

    A DataProto with no column has batch size 0.
    """

    __slots__ = ("tensors", "non_tensors", "meta_info")

    def __init__(
        self,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Any] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> None:
        for name, arg in (("tensors", tensors), ("non_tensors", non_tensors), ("meta_info", meta_info)):
            if arg is not None and not isinstance(arg, Mapping):
                raise TypeError(f"DataProto: {name} must be a dict, got {type(arg).__name__}")
        self.tensors: dict[str, torch.Tensor] = dict(tensors or {})
        self.non_tensors: dict[str, np.ndarray] = {k: _as_array(v) for k, v in (non_tensors or {}).items()}
        self.meta_info: dict[str, Any] = dict(meta_info or {})
        self._check()

    @classmethod
    def from_dict(
        cls,
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Any] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> DataProto:
        """Same as the constructor, spelled as in verl."""
        return cls(tensors, non_tensors, meta_info)

    @classmethod
    def from_single_dict(cls, data: Mapping[str, Any], meta_info: Mapping[str, Any] | None = None) -> DataProto:
        """Split one flat dict: torch tensors become ``tensors``, numpy arrays/lists/tuples ``non_tensors``."""
        return cls(*split_flat(data), meta_info)

    # -- validation and basic access ---------------------------------------------------------

    def _check(self, where: str = "DataProto") -> int:
        """Check types and that every column has the same number of rows; return that number."""
        ref = None
        for kind, columns, expected in (
            ("tensor", self.tensors, torch.Tensor),
            ("non-tensor", self.non_tensors, np.ndarray),
        ):
            for key, col in columns.items():
                if not isinstance(key, str):
                    raise TypeError(f"{where}: column names must be str, got {key!r} ({type(key).__name__})")
                if not isinstance(col, expected):
                    hint = (
                        "pass it in non_tensors or convert it with torch.as_tensor"
                        if kind == "tensor"
                        else "pass it in tensors"
                        if isinstance(col, torch.Tensor)
                        else "use a numpy array or a list"
                    )
                    raise TypeError(
                        f"{where}: {kind} {key!r} is a {type(col).__name__}; "
                        f"expected {expected.__module__}.{expected.__name__} ({hint})"
                    )
                if col.ndim == 0:
                    raise ValueError(
                        f"{where}: {kind} {key!r} is 0-dimensional; a column needs a leading batch dimension "
                        f"(put a per-batch value in meta_info)"
                    )
                if ref is None:
                    ref = (kind, key, col.shape[0])
                elif col.shape[0] != ref[2]:
                    size = "batch size" if kind == "tensor" else "length"
                    raise ValueError(
                        f"{where}: {kind} {key!r} has {size} {col.shape[0]} but {ref[0]} {ref[1]!r} has {ref[2]} "
                        f"(every column must have one entry per row)"
                    )
        both = self.tensors.keys() & self.non_tensors.keys()
        if both:
            raise ValueError(
                f"{where}: {sorted(both)[0]!r} is both a tensor and a non-tensor column; names must be unique"
            )
        return 0 if ref is None else ref[2]

    @property
    def batch_size(self) -> int:
        """Number of rows (0 when there is no column)."""
        return self._check()

    def __len__(self) -> int:
        return self._check()

    # verl's names for the two column dicts, so code written against verl's DataProto runs as is
    @property
    def batch(self) -> dict[str, torch.Tensor]:
        """``tensors``, under verl's name (the same dict: writing into it writes ``tensors``)."""
        return self.tensors

    @property
    def non_tensor_batch(self) -> dict[str, np.ndarray]:
        """``non_tensors``, under verl's name (the same dict)."""
        return self.non_tensors

    def keys(self) -> list[str]:
        """Column names: tensor columns first, then non-tensor columns (meta_info keys are not columns)."""
        return [*self.tensors, *self.non_tensors]

    def __contains__(self, key: object) -> bool:
        """True when ``key`` is a tensor or non-tensor column (not a meta_info key)."""
        return key in self.tensors or key in self.non_tensors

    def __iter__(self) -> Iterator[DataProtoItem]:
        """Rows, each a ``DataProtoItem`` (use ``keys()`` for the column names)."""
        return (self[i] for i in range(len(self)))

    @overload
    def __getitem__(self, index: str) -> Any: ...
    @overload
    def __getitem__(self, index: int | np.integer) -> DataProtoItem: ...
    @overload
    def __getitem__(self, index: slice | Sequence[int] | Sequence[bool] | np.ndarray) -> DataProto: ...
    @overload
    def __getitem__(self, index: torch.Tensor) -> DataProto | DataProtoItem: ...  # a 0-d tensor is a row number
    def __getitem__(self, index: str | Index) -> Any:
        """``data["key"]``: the column. An int: the row, a ``DataProtoItem`` (no batch dimension, as
        in verl and torch). Otherwise rows as a DataProto: a slice gives a view; a list/array/tensor
        of ints (in that order, repeats allowed) or a boolean mask (one entry per row) a copy."""
        if isinstance(index, str):
            if index in self.tensors:
                return self.tensors[index]
            if index in self.non_tensors:
                return self.non_tensors[index]
            raise KeyError(unknown_key("column", index, self.keys()))
        rows = self._rows(index)
        if is_row_number(index):
            assert isinstance(rows, slice)  # a row number is a one-row slice
            i = rows.start
            return DataProtoItem(
                {k: v[i] for k, v in self.tensors.items()},
                {k: v[i] for k, v in self.non_tensors.items()},
                self.meta_info,
            )
        return self._take(rows)

    def __setitem__(self, key: str, value: Any) -> None:
        """Add or replace one column: a ``torch.Tensor`` goes to ``tensors``, an array or list to
        ``non_tensors``. Its length must match the batch unless it is the only column."""
        if not isinstance(key, str):
            raise TypeError(
                f"DataProto[...] = value takes a column name (str), got {type(key).__name__}; "
                f"to change rows, write into a column: data['name'][rows] = ..."
            )
        is_tensor = isinstance(value, torch.Tensor)
        target: dict[str, Any]
        other: dict[str, Any]
        target, other = (self.tensors, self.non_tensors) if is_tensor else (self.non_tensors, self.tensors)
        if key in other:
            raise ValueError(
                f"DataProto[{key!r}] = ...: {key!r} is already a {'non-tensor' if is_tensor else 'tensor'} "
                f"column; `del data[{key!r}]` first to change its kind"
            )
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
            raise KeyError(unknown_key("column", key, self.keys()))

    # -- rows ----------------------------------------------------------------------------------

    def _rows(self, index: Index) -> slice | np.ndarray:
        """Normalise a row index to a slice (view) or an int64 array of row numbers (copy)."""
        return row_index(index, len(self))

    def _take(self, rows: slice | np.ndarray) -> DataProto:
        if isinstance(rows, slice):
            tensors = {k: v[rows] for k, v in self.tensors.items()}
        else:
            index = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
            tensors = {k: v[index.to(v.device)] for k, v in self.tensors.items()}
        return DataProto(tensors, {k: v[rows] for k, v in self.non_tensors.items()}, self.meta_info)

    def chunk(self, n: int) -> list[DataProto]:
        """``n`` consecutive views; with ``len(self) = q*n + r`` the first ``r`` chunks get
        ``q + 1`` rows and the rest ``q`` (numpy's ``array_split``; 10 rows in 4 -> 3, 3, 2, 2).
        ``n > len(self)`` is an error (a worker would get an empty batch): ``pad_to_divisor`` first."""
        n, size = positive_int(n, "DataProto.chunk", "n"), len(self)
        if n > max(size, 1):
            raise ValueError(
                f"DataProto.chunk({n}) of a batch of {size} rows would leave {n - size} chunks empty; "
                f"call pad_to_divisor({n}) first or use at most {size} chunks"
            )
        q, r = divmod(size, n)
        bounds = np.cumsum([0] + [q + (i < r) for i in range(n)])
        return [self[int(a) : int(b)] for a, b in zip(bounds[:-1], bounds[1:])]

    def split(self, size: int) -> list[DataProto]:
        """Consecutive views of ``size`` rows, the last one shorter when ``size`` does not divide
        the batch (``torch.split``); an empty batch gives an empty list."""
        size = positive_int(size, "DataProto.split", "size")
        return [self[i : i + size] for i in range(0, len(self), size)]

    def repeat(self, n: int | None = None, interleave: bool = True, *, repeat_times: int | None = None) -> DataProto:
        """Each row ``n`` (verl: ``repeat_times``) times: rows [a, b] give [a, a, b, b] when
        ``interleave`` (how GRPO lays out a group of samples per prompt), [a, b, a, b] otherwise. Copies."""
        if (n is None) == (repeat_times is None):
            raise TypeError("DataProto.repeat takes the number of copies once: n (or verl's repeat_times)")
        n, rows = positive_int(n if n is not None else repeat_times, "DataProto.repeat", "n"), np.arange(len(self))
        return self._take(np.repeat(rows, n) if interleave else np.tile(rows, n))

    def reorder(self, indices: Index) -> DataProto:
        """Permute the rows in place (row ``i`` becomes old row ``indices[i]``); returns ``self``.
        ``indices`` must use every row once; to select or duplicate rows use ``data[indices]``."""
        rows, n = self._rows(indices), len(self)
        rows = np.arange(n)[rows] if isinstance(rows, slice) else rows
        if rows.shape[0] != n or not np.array_equal(np.sort(rows), np.arange(n)):
            raise ValueError(
                f"DataProto.reorder needs a permutation of the {n} rows (each exactly once), got "
                f"{reprlib.repr(rows.tolist())}; use data[indices] to select or duplicate rows"
            )
        reordered = self._take(rows)
        replace_columns(self.tensors, reordered.tensors)
        replace_columns(self.non_tensors, reordered.non_tensors)
        return self

    def pad_to_divisor(self, k: int) -> tuple[DataProto, int]:
        """Append copies of the first rows (cycling when ``k`` exceeds the batch) until the batch
        size is a multiple of ``k``; return ``(padded, pad_size)``. Padded rows are real samples,
        so a worker computes on valid data; ``unpad(pad_size)`` drops them afterwards."""
        k, n = positive_int(k, "DataProto.pad_to_divisor", "k"), len(self)
        pad = -n % k
        if pad == 0:
            return self._take(slice(None)), 0
        return self._take(np.concatenate([np.arange(n), np.arange(pad) % n])), pad

    def unpad(self, pad_size: int) -> DataProto:
        """A view without the last ``pad_size`` rows (the inverse of ``pad_to_divisor``)."""
        n = len(self)
        if isinstance(pad_size, bool) or not isinstance(pad_size, (int, np.integer)) or not 0 <= pad_size <= n:
            raise ValueError(
                f"DataProto.unpad: pad_size must be an int in [0, {n}] for a batch of {n} rows, got {pad_size!r}"
            )
        return self[: n - int(pad_size)]

    @staticmethod
    def concat(items: Sequence[DataProto]) -> DataProto:
        """Stack batches row-wise (copies). Every item needs the same columns, with the same
        dtype, trailing shape and device per tensor. ``meta_info["metrics"]`` (a dict of name ->
        value per item, e.g. one per worker) are merged by ``armor_core.dataproto.metrics.merge_metrics``
        (max for seconds and maxima, mean otherwise); every other meta_info key must be present
        with an equal value in every item."""
        items = list(items)
        if not items:
            raise ValueError("DataProto.concat: got an empty list; there is nothing to concatenate")
        for i, item in enumerate(items):
            if not isinstance(item, DataProto):
                raise TypeError(f"DataProto.concat: item {i} is a {type(item).__name__}; expected DataProto")
        return DataProto(*stack_rows(items))

    # -- columns -------------------------------------------------------------------------------

    def select(
        self, tensor_keys: Keys = None, non_tensor_keys: Keys = None, meta_keys: Keys = None, **verl_names: Any
    ) -> DataProto:
        """A DataProto with exactly the named columns (an omitted column argument names none, so
        ``select(tensor_keys=["input_ids"])`` has no non-tensor), and all of meta_info unless
        ``meta_keys`` names some. A str is one key. The columns are shared, not copied.
        With verl's names (``batch_keys``, ``non_tensor_batch_keys``, ``meta_info_keys``,
        ``deepcopy``) it means what verl's ``select`` means: an omitted argument keeps every key of its kind."""
        if verl_names:
            deep, keys = verl_key_args("select", verl_names, (tensor_keys, non_tensor_keys, meta_keys))
            out = DataProto(
                *(pick(src, k, kind, "select") for src, k, kind in self._kinds(*keys))
            )  # None: every key of its kind
            return copy.deepcopy(out) if deep else out
        picked = [
            pick(src, [] if keys is None and kind != "meta_info key" else keys, kind, "select")
            for src, keys, kind in self._kinds(tensor_keys, non_tensor_keys, meta_keys)
        ]
        return DataProto(*picked)

    def pop(
        self, tensor_keys: Keys = None, non_tensor_keys: Keys = None, meta_keys: Keys = None, **verl_names: Any
    ) -> DataProto:
        """Remove the named keys from ``self`` and return them as a DataProto (an omitted argument
        names none, meta_info included; verl's argument names work too). Every key is checked
        before anything is removed."""
        if verl_names:
            _, (tensor_keys, non_tensor_keys, meta_keys) = verl_key_args(
                "pop", verl_names, (tensor_keys, non_tensor_keys, meta_keys)
            )
        kinds = [
            (src, [] if keys is None else keys, kind)
            for src, keys, kind in self._kinds(tensor_keys, non_tensor_keys, meta_keys)
        ]
        picked = [pick(src, keys, kind, "pop") for src, keys, kind in kinds]
        for (src, _, _), removed in zip(kinds, picked):
            for key in removed:
                del src[key]
        return DataProto(*picked)

    def _kinds(self, tensor_keys: Keys, non_tensor_keys: Keys, meta_keys: Keys) -> list[tuple[dict, Keys, str]]:
        return [
            (self.tensors, tensor_keys, "tensor"),
            (self.non_tensors, non_tensor_keys, "non-tensor"),
            (self.meta_info, meta_keys, "meta_info key"),
        ]

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> DataProto:
        """Rename columns in place (tensor or non-tensor, wherever each lives); returns ``self``.
        Swaps such as ``rename(["a", "b"], ["b", "a"])`` work; renaming onto another existing
        column is an error."""
        mapping = rename_mapping(key_list(old_keys), key_list(new_keys), self.keys())
        for columns in (self.tensors, self.non_tensors):
            replace_columns(columns, {mapping.get(k, k): v for k, v in columns.items()})
        return self

    def union(self, other: DataProto) -> DataProto:
        """Add ``other``'s columns and meta_info to ``self`` in place; returns ``self``. A key in
        both must hold equal values (then ``self``'s is kept); a different value is an error
        naming the key: nothing is ever silently dropped."""
        if not isinstance(other, DataProto):
            raise TypeError(f"DataProto.union: expected a DataProto, got {type(other).__name__}")
        n, m = len(self), len(other)
        if self.keys() and other.keys() and n != m:
            raise ValueError(f"DataProto.union: batch sizes differ ({n} rows in self, {m} in other)")
        for key in (self.tensors.keys() & other.non_tensors.keys()) | (self.non_tensors.keys() & other.tensors.keys()):
            raise ValueError(
                f"DataProto.union: {key!r} is a tensor column in one batch and a non-tensor column in the other"
            )
        for mine, theirs, kind in (
            (self.tensors, other.tensors, "tensor"),
            (self.non_tensors, other.non_tensors, "non-tensor"),
            (self.meta_info, other.meta_info, "meta_info key"),
        ):
            for key, value in theirs.items():
                if key in mine and not same_value(mine[key], value):
                    raise ValueError(
                        f"DataProto.union: {kind} {key!r} differs between the two batches; "
                        f"rename or pop one of them first"
                    )
        _fill_missing(self.tensors, other.tensors)
        _fill_missing(self.non_tensors, other.non_tensors)
        _fill_missing(self.meta_info, other.meta_info)
        return self

    def to(self, device: str | torch.device, non_blocking: bool = False) -> DataProto:
        """A DataProto whose tensors are on ``device`` (non-tensors and meta_info are shared)."""
        return DataProto(
            {k: v.to(device, non_blocking=non_blocking) for k, v in self.tensors.items()},
            self.non_tensors,
            self.meta_info,
        )

    # -- files, pickling, display ---------------------------------------------------------------

    def save(self, path: str | Path) -> None:
        """Write one safetensors file: tensors and numeric non-tensors as safetensors tensors,
        string/object non-tensors and meta_info as JSON. Anything JSON would not give back
        unchanged (a tuple, a numpy scalar, a nested array) is refused, naming where it is."""
        protocol_io.save(self, path)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> DataProto:
        """Read a file written by ``save``; tensors are placed on ``device``. Never unpickles."""
        return cls(*protocol_io.load(path, device))

    def __getstate__(self) -> dict[str, Any]:
        return protocol_io.to_state(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.tensors, self.non_tensors, self.meta_info = protocol_io.from_state(state)
        self._check("DataProto (unpickled)")

    def __copy__(self) -> DataProto:
        return DataProto(self.tensors, self.non_tensors, self.meta_info)

    def __deepcopy__(self, memo: dict) -> DataProto:
        return DataProto(
            copy.deepcopy(self.tensors, memo),
            copy.deepcopy(self.non_tensors, memo),
            copy.deepcopy(self.meta_info, memo),
        )

    def __repr__(self) -> str:
        try:
            size: Any = len(self)
        except (TypeError, ValueError):  # repr must work on the broken batch an error is about
            size = "invalid"
        lines = [f"DataProto(batch_size={size}"]
        lines += [f"  tensor     {key}: {summary(col)}" for key, col in self.tensors.items()]
        lines += [f"  non_tensor {key}: {summary(col)}" for key, col in self.non_tensors.items()]
        return "\n".join(lines + [f"  meta_info  {list(self.meta_info)})"])
