"""What ``armor run`` checks in the driver before any worker starts, beyond the config's own checks:
the model directory and the guards' parameters (``check_run``).

A worker loads the weights some 20 s after ``armor run`` begins (Ray, placement, imports), and
transformers' error for a damaged file rarely names it. Here the driver reads what can be read
cheaply: ``config.json`` (and a LoRA adapter's ``adapter_config.json`` with its base model),
every ``*.safetensors`` file's header (its 8-byte length, the JSON header, and each tensor's
offsets against its dtype, shape and the file's size; no tensor is loaded), the shards an
``*.safetensors.index.json`` names, and the tokenizer, which it loads. A problem is a
``ModelPathError`` naming the file and what is wrong with it. The guards are built once with
their configured parameters, so a bad one is a ``ConfigError`` naming the guard, in ``--dry-run``
too, not a traceback from the trainer.

Not caught: a byte changed inside a tensor's data (only a checksum would show it, and a model
directory carries none).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from armor_core.config.schema import ArmorConfig
from armor_core.models.loading import ModelPathError, load_tokenizer, resolve_model_path
from armor_core.stability.guard import build_guards, run_coefficients

__all__ = ["check_guards", "check_model", "check_model_dir", "check_run", "check_safetensors", "check_tokenizer"]

#: bytes per element of each safetensors dtype (a dtype not listed is not size-checked)
_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
_MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit on the JSON header
_DAMAGED = "the file is damaged or incomplete; copy it again from where the model was saved"


def check_run(cfg: ArmorConfig, pm: Any = None) -> None:
    """Everything this module checks, for the run ``cfg`` describes (plugins from ``pm``)."""
    check_model(cfg.model.path, cfg.model.tokenizer_path)
    check_guards(cfg, pm)


def check_guards(cfg: ArmorConfig, pm: Any = None) -> None:
    """Build each configured guard once, as every process will (``stability.guard.build_guards``): a parameter
    its constructor refuses is a ConfigError naming the guard, before any worker starts."""
    if cfg.guard.enable:
        build_guards(cfg.guard.guards, pm, run_coefficients(cfg.actor))


def check_model(model_path: str, tokenizer_path: str | None = None) -> None:
    """Check ``model.path`` (and ``model.tokenizer_path``, else the model's own tokenizer).

    :raises ModelPathError: naming the file and what is wrong; for a path that is not a local
        directory (a hub name), the error ``resolve_model_path`` gives: ARMOR never downloads.
    """
    check_model_dir(model_path)
    check_tokenizer(tokenizer_path or model_path)


def check_model_dir(path: str | Path) -> Path:
    """The model directory at ``path`` (``builtin:NAME`` or local), checked; see the module docstring."""
    directory = resolve_model_path(path, need_tokenizer=False)
    if not (directory / "config.json").is_file():  # resolve_model_path allows a LoRA adapter instead
        adapter = _json_object(directory / "adapter_config.json")
        base = adapter.get("base_model_name_or_path")
        if not base:
            raise ModelPathError(
                f"{directory / 'adapter_config.json'} names no base_model_name_or_path; set it to the base model's "
                "directory"
            )
        _check_weights(directory, "adapter_model")
        check_model_dir(base)
        return directory
    config = _json_object(directory / "config.json")
    if not isinstance(config.get("model_type"), str):
        raise ModelPathError(
            f"{directory / 'config.json'} has no 'model_type'; it was not written by save_pretrained() "
            "(transformers reads the architecture from it)"
        )
    _check_weights(directory, "model")
    return directory


def check_tokenizer(path: str | Path) -> None:
    """The tokenizer at ``path``: its JSON files parse and it loads as ``armor run`` will load it."""
    directory = resolve_model_path(path, need_config=False)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json"):
        if (directory / name).is_file():
            _json_object(directory / name)
    try:
        load_tokenizer(path)
    except ModelPathError:
        raise
    except Exception as e:  # tokenizers and transformers raise many kinds; all mean the same here
        raise ModelPathError(
            f"the tokenizer in {directory} cannot be loaded: {type(e).__name__}: {' '.join(str(e).split())}"
        ) from None


def check_safetensors(path: Path) -> None:
    """The header of the safetensors file ``path`` and the tensor offsets it declares, against the file's size.

    :raises ModelPathError: naming ``path`` and the first inconsistency found.
    """
    size = path.stat().st_size
    if size < 8:
        raise ModelPathError(
            f"{path} has {size} bytes, fewer than a safetensors file's 8-byte header length; {_DAMAGED}"
        )
    with open(path, "rb") as fh:
        length = int.from_bytes(fh.read(8), "little")
        if length > min(size - 8, _MAX_HEADER_BYTES):
            raise ModelPathError(
                f"{path}: its header says the JSON header has {length} bytes, but the file has {size}; {_DAMAGED}"
            )
        raw = fh.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelPathError(f"{path}: the safetensors header is not valid JSON ({e}); {_DAMAGED}") from None
    if not isinstance(header, dict):
        raise ModelPathError(
            f"{path}: the safetensors header is a JSON {type(header).__name__}, not an object; {_DAMAGED}"
        )
    data_bytes = size - 8 - length
    covered = max(
        (_tensor_end(path, name, entry, data_bytes) for name, entry in header.items() if name != "__metadata__"),
        default=0,
    )
    if covered != data_bytes:
        raise ModelPathError(
            f"{path}: the tensors in its header cover {covered} bytes of data but the file holds {data_bytes}; "
            f"{_DAMAGED}"
        )


def _tensor_end(path: Path, name: str, entry: Any, data_bytes: int) -> int:
    """Where tensor ``name``'s data ends, after checking its entry against its dtype, shape and the data's size."""
    try:
        dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
        begin, end, count = int(begin), int(end), math.prod(int(d) for d in shape)
    except (KeyError, TypeError, ValueError):
        raise ModelPathError(
            f"{path}: the header's entry for tensor {name!r} is not {{dtype, shape, data_offsets: [begin, end]}}; "
            f"{_DAMAGED}"
        ) from None
    if not 0 <= begin <= end:
        raise ModelPathError(f"{path}: tensor {name!r} has data_offsets [{begin}, {end}]; {_DAMAGED}")
    if dtype in _DTYPE_BYTES and end - begin != count * _DTYPE_BYTES[dtype]:
        raise ModelPathError(
            f"{path}: tensor {name!r} ({dtype}, shape {list(shape)}) needs {count * _DTYPE_BYTES[dtype]} bytes "
            f"but its offsets span {end - begin}; {_DAMAGED}"
        )
    if end > data_bytes:
        raise ModelPathError(
            f"{path}: tensor {name!r} ends at byte {end} of the data, but the file holds only {data_bytes} bytes of "
            f"tensor data; {_DAMAGED}"
        )
    return end


def _check_weights(directory: Path, stem: str) -> None:
    """The weight files of ``directory``: every shard an index names exists, every safetensors file is sound."""
    for index in sorted(directory.glob("*.safetensors.index.json")):
        weight_map = _json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelPathError(f"{index} has no 'weight_map' {{tensor name: shard file}}; {_DAMAGED}")
        for shard in sorted(set(map(str, weight_map.values()))):
            if not (directory / shard).is_file():
                raise ModelPathError(
                    f"{index} names the shard {shard!r}, which is not in {directory}; the model was copied incompletely"
                )
    files = sorted(directory.glob("*.safetensors"))
    if not files and not any(directory.glob(f"{stem}*.bin")):
        raise ModelPathError(
            f"{directory} holds no weights ({stem}.safetensors or its shards); expected a directory written by "
            "save_pretrained()"
        )
    for f in files:
        check_safetensors(f)


def _json_object(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelPathError(f"{path} is missing") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelPathError(f"{path} is not valid JSON ({e}); {_DAMAGED}") from None
    if not isinstance(value, dict):
        raise ModelPathError(f"{path} holds a JSON {type(value).__name__}; expected an object; {_DAMAGED}")
    return value
