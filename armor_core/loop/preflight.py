"""What ``armor run`` checks in the driver before any worker starts, beyond the config's own checks:
the model directory, the reward models' and local judges' (``check_reward_models``, each error naming its
key) and the guards' parameters (``check_run``).

A worker loads the weights some 20 s after ``armor run`` begins (Ray, placement, imports), and
transformers' error for a damaged file rarely names it. Here the driver reads what can be read
cheaply: ``config.json`` (and a LoRA adapter's ``adapter_config.json`` with its base model),
every ``*.safetensors`` file's header (its 8-byte length, the JSON header, and each tensor's
offsets against its dtype, shape and the file's size; no tensor is loaded), the shards an
``*.safetensors.index.json`` names, and the tokenizer, which it loads. Then each floating-point
tensor, one at a time from the memory-mapped file, for NaN or inf: a model that holds one samples
from a NaN distribution at its first token (the read also warms the page cache the workers load
from). A problem is a ``ModelPathError`` naming the file (and tensor) and what is wrong with it.
For ``armor run`` (``check_trainable``): ``model.path`` must be a model, not a LoRA adapter, and
with ``model.lora_rank`` the LoRA targets and rank must fit the model's layers, read from a copy
built on the meta device (no weights). A LoRA adapter's base must be the one it was trained on
(``models/lora.py``'s base manifest). The guards are built once with
their configured parameters, so a bad one is a ``ConfigError`` naming the guard, in ``--dry-run``
too, not a traceback from the trainer. With multi-turn rollouts (``check_multi_turn``) the environment's
name, its ``environment_kwargs`` keys and its own ``check_params`` (the ``tools`` environment: the
parser, each tool importable) are checked the same way.

Not caught: a byte changed inside a tensor's data (only a checksum would show it, and a model
directory carries none).
"""

from __future__ import annotations

import json
import math
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from armor_core.config.schema import ArmorConfig, ConfigError
from armor_core.interfaces import capability, unknown_param
from armor_core.models.loading import ModelPathError, load_tokenizer, resolve_model_path
from armor_core.models.remote_code import check_remote_code
from armor_core.plugins import PluginManager, get_plugin_manager
from armor_core.stability.guard import build_guards, run_coefficients
from armor_core.workers.rollout.multi_turn import environment_params

__all__ = [
    "check_finite",
    "check_guards",
    "check_model",
    "check_model_dir",
    "check_multi_turn",
    "check_run",
    "check_safetensors",
    "check_tokenizer",
    "check_reward_models",
    "check_trainable",
    "named",
]

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


def check_run(cfg: ArmorConfig, pm: PluginManager | None = None) -> None:
    """Everything this module checks, for the run ``cfg`` describes (plugins from ``pm``)."""
    check_model(cfg.model.path, cfg.model.tokenizer_path, trust_remote_code=cfg.model.trust_remote_code)
    check_trainable(cfg)
    check_guards(cfg, pm)
    check_reward_models(cfg)
    check_multi_turn(cfg, pm)
    from armor_core.loop.distill import check_teacher  # here: loop.distill imports this module

    check_teacher(cfg)


def check_reward_models(cfg: ArmorConfig) -> None:
    """The directories of ``reward.model`` and of local ``reward.judge`` entries, checked as ``model.path`` is:
    otherwise a reward worker finds a damaged one at the first batch, and every row fails.

    :raises ModelPathError: naming the entry's key (``reward.judge[1].model``), the directory and what is wrong.
    """
    from armor_core.rewards.judge import judge_models
    from armor_core.rewards.model import model_paths

    for key, path in [*model_paths(cfg.reward.model), *judge_models(cfg.reward.judge)]:
        with named(key, path):
            check_model(path)


@contextmanager
def named(key: str, value: Any) -> Iterator[None]:
    """A ``ModelPathError`` raised inside, prefixed with the config key whose value was checked (``key=value: ...``)."""
    try:
        yield
    except ModelPathError as e:
        raise ModelPathError(f"{key}={value}: {e}") from None


def check_trainable(cfg: ArmorConfig) -> None:
    """``model.path`` is a model (an adapter alone has nothing to train with ``model.lora_rank=0``,
    and with LoRA would get adapters on adapters), and the LoRA settings fit its layers.

    :raises ModelPathError: for an adapter directory; ``ConfigError`` naming the LoRA key that does not fit.
    """
    m = cfg.model
    directory = resolve_model_path(m.path, need_tokenizer=False)
    if not (directory / "config.json").is_file():  # check_model_dir accepted it as an adapter
        base = _json_object(directory / "adapter_config.json").get("base_model_name_or_path")
        raise ModelPathError(
            f"model.path={m.path} is a LoRA adapter (adapter_config.json), not a model, and armor run trains a "
            f"model. Set model.path to its base ({base}) with model.lora_rank > 0 for a new adapter, or merge this "
            "one into its base first (armor export CHECKPOINT --merge) and train the merged model"
        )
    if not m.lora_rank:
        return
    from armor_core.models.lora import check_shape

    model = _meta_model(directory, m.trust_remote_code)
    if model is None:
        return  # an architecture that cannot be built without weights: the worker checks when it applies LoRA
    try:
        check_shape(model, m.lora_rank, m.lora_target_modules)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _meta_model(directory: Path, trust_remote_code: bool) -> Any:
    """The model of ``directory`` built on the meta device: its modules and shapes, no weights, no memory."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(directory), local_files_only=True, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except Exception:  # transformers raises many kinds for an architecture it cannot build this way
        return None


def check_guards(cfg: ArmorConfig, pm: PluginManager | None = None) -> None:
    """Build each configured guard once, as every process will (``stability.guard.build_guards``): a parameter
    its constructor refuses is a ConfigError naming the guard, before any worker starts."""
    if cfg.guard.enable:
        build_guards(cfg.guard.guards, pm, run_coefficients(cfg.actor))


def check_multi_turn(cfg: ArmorConfig, pm: PluginManager | None = None) -> None:
    """With ``rollout.multi_turn.enable``: the environment is registered, takes every key of
    ``rollout.multi_turn.environment_kwargs``, and its own ``check_params`` (if it has one) accepts what every
    episode will get; each problem a ConfigError (PluginError for the name) with the nearest name, before any
    worker starts, where it failed once the workers had built their first episode."""
    mt = cfg.rollout.multi_turn
    if not mt.enable:
        return
    pm = pm or get_plugin_manager()
    env_cls = pm.get("environment", mt.environment, where="rollout.multi_turn.environment")
    problem = unknown_param(env_cls, mt.environment_kwargs, 1, "rollout.multi_turn.environment_kwargs")
    if problem:
        raise ConfigError(problem)
    check = capability("environment", env_cls, "check_params")
    if check is None:
        return
    try:
        check(**environment_params(env_cls, mt))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"rollout.multi_turn (environment {mt.environment!r}): {e}") from None


def check_model(model_path: str, tokenizer_path: str | None = None, *, trust_remote_code: bool = False) -> None:
    """Check ``model.path`` (and ``model.tokenizer_path``, else the model's own tokenizer).

    :param trust_remote_code: ``model.trust_remote_code``; without it a directory that only its own
        Python code can load is refused (``models/remote_code.py``).
    :raises ModelPathError: naming the file and what is wrong; for a path that is not a local
        directory (a hub name), the error ``resolve_model_path`` gives: ARMOR never downloads.
    """
    check_model_dir(model_path, trust_remote_code=trust_remote_code)
    check_tokenizer(tokenizer_path or model_path, trust_remote_code=trust_remote_code)


def check_model_dir(path: str | Path, *, trust_remote_code: bool = False) -> Path:
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
        base_dir = check_model_dir(base, trust_remote_code=trust_remote_code)
        from armor_core.models.lora import base_problem

        why = base_problem(directory, base_dir)
        if why is not None:
            raise ModelPathError(
                f"the LoRA adapter in {directory} was trained on another base model than {base_dir}: {why}. An "
                "adapter is only valid on its own base: restore that model, or point adapter_config.json's "
                "base_model_name_or_path at it"
            )
        return directory
    config = _json_object(directory / "config.json")
    if not isinstance(config.get("model_type"), str):
        raise ModelPathError(
            f"{directory / 'config.json'} has no 'model_type'; it was not written by save_pretrained() "
            "(transformers reads the architecture from it)"
        )
    check_remote_code(directory, trust_remote_code)
    _check_weights(directory, "model")
    return directory


def check_tokenizer(path: str | Path, *, trust_remote_code: bool = False) -> None:
    """The tokenizer at ``path``: its JSON files parse and it loads as ``armor run`` will load it."""
    directory = resolve_model_path(path, need_config=False)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json"):
        if (directory / name).is_file():
            _json_object(directory / name)
    try:
        load_tokenizer(path, trust_remote_code=trust_remote_code)
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
    for f in files:
        check_finite(f)


def check_finite(path: Path) -> None:
    """Every floating-point tensor of the safetensors file ``path`` is finite (one tensor in memory at a time).

    :raises ModelPathError: naming the file, the first tensor holding NaN or inf, and how many values.
    """
    import torch
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        for name in fh.keys():
            t = fh.get_tensor(name)
            if t.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64) or bool(
                torch.isfinite(t).all()
            ):
                continue
            bad = int((~torch.isfinite(t)).sum())
            raise ModelPathError(
                f"{path}: tensor {name!r} holds {bad} NaN or inf value(s) of {t.numel()}; a model with non-finite "
                "weights samples from a NaN distribution. Take the weights from before they diverged (an earlier "
                "checkpoint), or the original model"
            )


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
