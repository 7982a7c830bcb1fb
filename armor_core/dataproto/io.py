"""DataProto on disk and across processes: the safetensors file format and the pickle state.

``DataProto.save``/``load`` and ``__getstate__``/``__setstate__`` delegate here; the class in
``armor_core.dataproto.protocol`` stays about rows and columns, this module about bytes.

Files. One safetensors file: tensors, and numeric non-tensors, as safetensors tensors; string or
object non-tensors and ``meta_info`` as JSON stored in uint8 tensors; a JSON manifest (format
``armor.dataproto/1``, column names, each non-tensor's dtype, shape and storage) in the file's
metadata. Never pickle, so loading a file cannot run code; a value JSON would not give back
unchanged (a tuple, a numpy scalar, a nested array) is refused on save, naming where it is.

Pickling (what Ray does between processes) ships each tensor as a flat uint8 numpy view of its
bytes. With pickle protocol 5 (Ray's) these travel as out-of-band buffers, written once into
the object store without going through ``torch.save`` (tensors under ``INLINE_BYTES`` go in-band
as plain bytes, which is cheaper for Ray at that size); and a slice ships only its own rows,
where torch would pickle the whole underlying storage. Unpickled tensors always land on the CPU
(the driver holds no GPU; workers call ``.to(device)``), and are copied out of Ray's read-only
shared memory so that writing into them is safe.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:
    from armor_core.dataproto.protocol import DataProto

__all__ = ["as_array", "from_state", "load", "save", "to_state"]

_FORMAT = "armor.dataproto/1"
_JSON_SCALARS = (str, int, float, bool, type(None))

Columns = tuple[dict[str, torch.Tensor], dict[str, np.ndarray], dict[str, Any]]


def as_array(value: Any) -> Any:
    """A list/tuple becomes a 1-D object array, one element per row (so rows of unequal length
    or lists of strings never become a 2-D or fixed-width string array); anything else is kept
    for ``DataProto._check`` to judge."""
    if not isinstance(value, (list, tuple)):
        return value
    arr = np.empty(len(value), dtype=object)
    for i, v in enumerate(value):
        arr[i] = v
    return arr


def save(data: DataProto, path: str | Path) -> None:
    """Write ``data`` to one safetensors file at ``path`` (see the module docstring for the layout).

    :raises TypeError: a non-tensor element or a meta_info value is not plain JSON
        (str, int, float, bool, None, list, dict with str keys); the message names where it is.
    """
    from safetensors.torch import save_file

    blobs: dict[str, torch.Tensor] = {}
    manifest: dict[str, Any] = {"format": _FORMAT, "tensors": list(data.tensors), "non_tensors": {}}
    seen: set[int] = set()
    for key, t in data.tensors.items():
        t = t.detach().cpu().contiguous()
        # safetensors refuses tensors that share storage (views of one batch, one tensor under
        # two names): give each its own
        storage = t.untyped_storage()
        if storage.nbytes() != t.nbytes or storage.data_ptr() in seen:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        blobs[f"tensor/{key}"] = t
    for key, arr in data.non_tensors.items():
        info = {"dtype": arr.dtype.str if arr.dtype != object else "object", "shape": list(arr.shape)}
        if arr.dtype.kind in "biuf":
            info["storage"] = "tensor"
            blobs[f"non_tensor/{key}"] = torch.from_numpy(np.array(arr, order="C", copy=True))
        else:
            info["storage"] = "json"
            values = arr.ravel().tolist() if arr.dtype != object else list(arr.ravel())
            for row, value in enumerate(values):
                _check_json(value, f"non-tensor {key!r} element {row}")
            blobs[f"non_tensor/{key}"] = _json_blob(values)
        manifest["non_tensors"][key] = info
    _check_json(data.meta_info, "meta_info")
    blobs["meta_info"] = _json_blob(data.meta_info)
    save_file(blobs, str(path), metadata={"armor": json.dumps(manifest)})


def load(path: str | Path, device: str | torch.device = "cpu") -> Columns:
    """Read a file written by ``save``: ``(tensors, non_tensors, meta_info)``, tensors on ``device``.
    Never unpickles.

    :raises ValueError: ``path`` is not a safetensors file, or has no DataProto manifest.
    """
    from safetensors import SafetensorError, safe_open

    try:
        f = safe_open(str(path), framework="pt", device="cpu")
    except SafetensorError as e:
        raise ValueError(f"DataProto.load: {path} is not a safetensors file written by DataProto.save ({e})") from None
    with f:
        manifest = json.loads((f.metadata() or {}).get("armor", "{}"))
        if manifest.get("format") != _FORMAT:
            raise ValueError(
                f"DataProto.load: {path} has no {_FORMAT!r} manifest; it was not written by DataProto.save"
            )
        tensors = {k: f.get_tensor(f"tensor/{k}").to(device) for k in manifest["tensors"]}
        non_tensors = {}
        for key, info in manifest["non_tensors"].items():
            blob = f.get_tensor(f"non_tensor/{key}")
            if info["storage"] == "tensor":
                arr = blob.numpy()
            elif info["dtype"] == "object":
                arr = as_array(json.loads(blob.numpy().tobytes()))
            else:
                arr = np.array(json.loads(blob.numpy().tobytes()), dtype=info["dtype"])
            non_tensors[key] = arr.astype(info["dtype"], copy=False).reshape(info["shape"])
        meta_info = json.loads(f.get_tensor("meta_info").numpy().tobytes())
    return tensors, non_tensors, meta_info


def to_state(data: DataProto) -> dict[str, Any]:
    """The pickle state of ``data``: ``{"tensors": {name: (dtype, shape, bytes, requires_grad)},
    "non_tensors": ..., "meta_info": ...}``, where ``bytes`` is a (nbytes,) uint8 numpy view of
    the tensor's contiguous CPU copy. The dicts of non-tensors and meta_info are shared, not copied."""
    # A flat uint8 numpy view works for every dtype (bfloat16 has no numpy twin) and pickles
    # as one PickleBuffer: out-of-band under protocol 5, and only this tensor's own bytes.
    tensors = {}
    for k, t in data.tensors.items():
        buf = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        # a small tensor travels in-band as bytes: below about this size Ray's bookkeeping for an
        # out-of-band buffer costs more than the copy (a 128-row rollout batch of 7 small
        # tensors: 2.3 -> 1.8 ms a Ray call, against 1.6 ms for an empty one)
        tensors[k] = (t.dtype, tuple(t.shape), buf.tobytes() if buf.nbytes <= INLINE_BYTES else buf, t.requires_grad)
    return {"tensors": tensors, "non_tensors": data.non_tensors, "meta_info": data.meta_info}


#: tensors up to this many bytes are pickled in-band (see ``to_state``)
INLINE_BYTES = 64 * 1024


def from_state(state: dict[str, Any]) -> Columns:
    """``(tensors, non_tensors, meta_info)`` from a ``to_state`` dict; tensors on the CPU, writable.
    The caller checks the row counts (``DataProto._check``)."""
    tensors = {}
    for key, (dtype, shape, buf, requires_grad) in state["tensors"].items():
        if isinstance(buf, bytes):
            buf = np.frombuffer(bytearray(buf), dtype=np.uint8)  # bytearray: writable
        elif not buf.flags.writeable:  # Ray hands out read-only shared memory; a write there would crash
            buf = buf.copy()
        tensors[key] = torch.from_numpy(buf).view(dtype).reshape(shape).requires_grad_(requires_grad)
    return tensors, dict(state["non_tensors"]), dict(state["meta_info"])


def _check_json(value: Any, where: str) -> None:
    """Refuse what JSON would not give back unchanged: save() never falls back to pickle."""
    if type(value) in _JSON_SCALARS:
        return
    if type(value) is list:
        for i, v in enumerate(value):
            _check_json(v, f"{where}[{i}]")
    elif type(value) is dict:
        for k, v in value.items():
            if type(k) is not str:
                raise TypeError(f"DataProto.save: {where} has key {k!r} ({type(k).__name__}); JSON keys must be str")
            _check_json(v, f"{where}[{k!r}]")
    else:
        raise TypeError(
            f"DataProto.save: {where} is a {type(value).__name__}, which cannot be saved without pickle; "
            f"use str, int, float, bool, None, list or dict with str keys (or drop it before saving)"
        )


def _json_blob(value: Any) -> torch.Tensor:
    """``value`` as JSON, UTF-8 encoded, in a (nbytes,) uint8 tensor (safetensors stores only tensors)."""
    return torch.frombuffer(bytearray(json.dumps(value).encode()), dtype=torch.uint8)
