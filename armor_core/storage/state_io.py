"""Worker state (optimizer, scheduler, RNG) on disk without pickles: ``<stem>.safetensors`` holds every
tensor, ``<stem>.json`` the structure around them.

``save_state`` takes nested dicts, lists and tuples of tensors and JSON scalars (str, int, float,
bool, None), which covers ``Optimizer.state_dict()``, ``LRScheduler.state_dict()`` and
``torch.get_rng_state()``. ``load_state`` gives back the same structure: tuples stay tuples (Adam's
``betas``), int dict keys stay ints (optimizer state is keyed by parameter index), floats come back
bit for bit (nan and inf included), tensors keep dtype, shape and values (0-d ``step`` counters and
uint8 RNG states too) and load onto the CPU. Anything else is a ``TypeError`` naming where it sits.

In the JSON a marker object with a single reserved key stands for what JSON cannot say:
``{"__tensor__": key}``, ``{"__tuple__": [...]}``, ``{"__float__": "nan"}``, and ``{"__items__":
[[key, value], ...]}`` for a dict with non-string keys (or a key that is a marker name).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from armor_core.errors import UserFacingError

__all__ = ["StateFileError", "load_checkpoint_state", "load_state", "save_state"]

_MARKERS = ("__tensor__", "__tuple__", "__float__", "__items__")
_SCALARS = (str, int, bool, type(None))


class StateFileError(UserFacingError, ValueError):
    """A state file that cannot be read back: damaged, incomplete, not written by ``save_state``, or an
    older checkpoint's ``.pt`` file that was not allowed (``load_checkpoint_state``)."""


def save_state(obj: Any, stem: str | Path) -> None:
    """Write ``obj`` to ``<stem>.safetensors`` and ``<stem>.json``."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    structure = _encode(obj, "", tensors, set())
    stem = Path(stem)
    save_file(tensors, str(stem.with_name(stem.name + ".safetensors")))
    stem.with_name(stem.name + ".json").write_text(json.dumps({"format": 1, "state": structure}, allow_nan=False))


def load_state(stem: str | Path) -> Any:
    """Read back what :func:`save_state` wrote at ``stem``; ``StateFileError`` names a damaged file."""
    from safetensors.torch import load_file

    stem = Path(stem)
    st_file, json_file = stem.with_name(stem.name + ".safetensors"), stem.with_name(stem.name + ".json")
    try:
        tensors = load_file(str(st_file))
    except FileNotFoundError:
        raise
    except Exception as e:  # safetensors raises its own SafetensorError for a bad header or short data
        raise StateFileError(
            f"{st_file}: not a readable safetensors file ({type(e).__name__}: {e}); "
            "the checkpoint is damaged or incomplete"
        ) from e
    try:
        structure = json.loads(json_file.read_text())["state"]
    except (ValueError, KeyError, TypeError) as e:
        raise StateFileError(
            f"{json_file}: not a state structure written by save_state ({type(e).__name__}: {e}); "
            "the checkpoint is damaged or incomplete"
        ) from e
    return _decode(structure, tensors, json_file)


def load_checkpoint_state(stem: str | Path, missing_ok: bool = False, allow_legacy_pt: bool = False) -> Any:
    """:func:`load_state` at ``stem``; None when its files are absent and ``missing_ok``.

    Checkpoints written before ARMOR saved state this way hold ``<stem>.pt`` (``torch.save``) files.
    They are read only with ``allow_legacy_pt`` (``trainer.allow_legacy_pt_state=true``), with
    ``torch.load(weights_only=True)``, which unpickles tensors and containers only; without it such
    a file is a ``StateFileError`` naming it and the option. Neither file there: ``FileNotFoundError``.
    """
    stem = Path(stem)
    if stem.with_name(stem.name + ".safetensors").exists():
        return load_state(stem)
    old = stem.with_name(stem.name + ".pt")
    if old.exists():
        if not allow_legacy_pt:
            raise StateFileError(
                f"{old} is a torch .pt state from an older ARMOR checkpoint, which is not unpickled by default; "
                "to resume from it, pass trainer.allow_legacy_pt_state=true"
            )
        return torch.load(old, weights_only=True)
    if missing_ok:
        return None
    raise FileNotFoundError(f"{stem}.safetensors is missing; the checkpoint is incomplete")


def _encode(x: Any, path: str, tensors: dict[str, torch.Tensor], storages: set) -> Any:
    """``x`` as JSON; its tensors go into ``tensors`` under path-like keys (``optimizer/state/0/exp_avg``)."""
    if isinstance(x, torch.Tensor):
        t = x.detach().cpu().contiguous()
        # safetensors refuses two tensors on one storage (views, or .cpu() of a CPU tensor saved twice)
        ptr = t.untyped_storage().data_ptr()
        if ptr != 0 and ptr in storages:
            t = t.clone()
        storages.add(t.untyped_storage().data_ptr())
        base = key = path or "tensor"
        n = 1
        while key in tensors:  # "a/b" as one dict key and as a nested path: keep both
            key, n = f"{base}#{n}", n + 1
        tensors[key] = t
        return {"__tensor__": key}
    if type(x) is float:
        return x if math.isfinite(x) else {"__float__": repr(x)}  # 'nan', 'inf', '-inf'
    if type(x) in _SCALARS:
        return x
    if type(x) in (list, tuple):
        items = [_encode(v, _join(path, i), tensors, storages) for i, v in enumerate(x)]
        return {"__tuple__": items} if type(x) is tuple else items
    if type(x) is dict:
        if all(type(k) is str and k not in _MARKERS for k in x):
            return {k: _encode(v, _join(path, k), tensors, storages) for k, v in x.items()}
        bad = [k for k in x if type(k) not in (str, int)]
        if bad:
            raise TypeError(
                f"state at '{path or '/'}' has a dict key {bad[0]!r} of type {type(bad[0]).__name__}; "
                "save_state takes str and int keys only"
            )
        return {"__items__": [[k, _encode(v, _join(path, k), tensors, storages)] for k, v in x.items()]}
    raise TypeError(
        f"state at '{path or '/'}' is a {type(x).__module__}.{type(x).__qualname__}, which save_state cannot "
        "write without a pickle; expected a tensor, dict, list, tuple, str, int, float, bool or None"
    )


def _join(path: str, key: Any) -> str:
    return f"{path}/{key}" if path else str(key)


def _decode(x: Any, tensors: dict[str, torch.Tensor], source: Path) -> Any:
    if isinstance(x, list):
        return [_decode(v, tensors, source) for v in x]
    if not isinstance(x, dict):
        return x
    if len(x) == 1 and next(iter(x)) in _MARKERS:
        ((marker, value),) = x.items()
        if marker == "__tensor__":
            if value not in tensors:
                raise StateFileError(
                    f"{source} names the tensor '{value}', which its .safetensors file does not hold; "
                    "the two files are from different saves"
                )
            return tensors[value]
        if marker == "__tuple__":
            return tuple(_decode(v, tensors, source) for v in value)
        if marker == "__float__":
            return float(value)
        return {k: _decode(v, tensors, source) for k, v in value}
    return {k: _decode(v, tensors, source) for k, v in x.items()}
