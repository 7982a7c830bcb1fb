"""LoRA for the actor (``model.lora_rank > 0``), built with peft.

Only the adapters train: the base weights stay frozen and outside the optimizer. The reference
policy is the same model with its adapters switched off (:func:`adapters_off`), so no second copy
is built. A rollout engine that holds its own weights (vLLM) receives the adapted layers' merged
weights under the base model's names (:func:`merged_weights`), nothing else: embeddings, norms and
the head never change. Checkpoints hold the adapter in peft's own format (``adapter/``, loadable
with ``peft.PeftModel.from_pretrained``); :func:`load_adapter_state` reads it back for a resume.

An adapter is only valid on the base it was trained on, and a base replaced in place keeps its
path: ``base_manifest.json`` beside the adapter records each base safetensors file's size and a
fingerprint (sha256 of its header and of the first and last MiB of its data: cheap at any model
size, and any retraining changes those bytes), checked on eval and resume (:func:`check_base`).
A change confined to the middle of a file is not seen. :func:`check_shape` checks the targets and
the rank against the model's layers; preflight runs it on a model built on the meta device.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from armor_core.errors import UserFacingError

ADAPTER = "default"  # peft's name for the one adapter a model has
ADAPTER_DIR = "adapter"
BASE_MANIFEST = "base_manifest.json"
_EDGE_BYTES = 1 << 20  # the bytes of tensor data at each end of a file that its fingerprint covers


class LoraResumeError(UserFacingError, ValueError):
    """A checkpoint's LoRA settings differ from the run's: the CLI prints it as one line (exit 2), even when
    the actor worker raises it."""


def _output_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """A Hugging Face model's output head (``get_output_embeddings``), None for a module without one."""
    get = getattr(model, "get_output_embeddings", None)
    return get() if get is not None else None


def _linear_names(model: torch.nn.Module) -> list[str]:
    """Short names (last component) of the model's linear layers, its output head left out."""
    head = _output_head(model)
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and m is not head
        }
    )


def _check_targets(model: torch.nn.Module, targets: list[str]) -> None:
    """Each target must name at least one module, and every module it names must be one peft wraps."""
    from transformers.pytorch_utils import Conv1D

    wrappable = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, Conv1D)
    modules = dict(model.named_modules())
    for target in targets:
        hits = [m for name, m in modules.items() if name == target or name.endswith("." + target)]
        if not hits:
            raise ValueError(
                f"model.lora_target_modules: {target!r} matches no module of {type(model).__name__}; "
                f"its linear layers are {_linear_names(model)} (or use 'all-linear')"
            )
        bad = sorted({type(m).__name__ for m in hits if not isinstance(m, wrappable)})
        if bad:
            raise ValueError(
                f"model.lora_target_modules: {target!r} is a {', '.join(bad)}, a layer type LoRA (peft) cannot wrap; "
                f"target linear layers instead: {_linear_names(model)}"
            )


def _targeted(model: torch.nn.Module, targets: Any) -> dict[str, torch.nn.Module]:
    """The modules LoRA would wrap: those ``targets`` names, or with 'all-linear' every linear layer but the head."""
    modules = dict(model.named_modules())
    if targets == "all-linear":
        head = _output_head(model)
        return {n: m for n, m in modules.items() if isinstance(m, torch.nn.Linear) and m is not head}
    targets = [targets] if isinstance(targets, str) else list(targets)
    return {n: m for n, m in modules.items() if any(n == t or n.endswith("." + t) for t in targets)}


def _dims(module: torch.nn.Module) -> tuple[int, ...]:
    """The (in, out) widths of a layer LoRA wraps; its A is (r, in) and B (out, r)."""
    if isinstance(module, torch.nn.Linear):
        return (module.in_features, module.out_features)
    if isinstance(module, torch.nn.Embedding):
        return (module.num_embeddings, module.embedding_dim)
    weight = getattr(module, "weight", None)
    return tuple(weight.shape[:2]) if isinstance(weight, torch.Tensor) and weight.dim() >= 2 else ()


def check_shape(model: torch.nn.Module, rank: int, targets: Any) -> None:
    """``model.lora_target_modules`` names layers of ``model`` that LoRA can wrap, and ``model.lora_rank``
    is at most the smallest width among them (a larger rank adds parameters, not expressiveness:
    B A has rank at most min(in, out)). ``model`` may live on the meta device.

    :raises ValueError: naming the key, what the model has, and what would be right.
    """
    if targets != "all-linear":
        _check_targets(model, [targets] if isinstance(targets, str) else list(targets))
    widths = {name: _dims(m) for name, m in _targeted(model, targets).items() if _dims(m)}
    if not widths:
        return
    name, dims = min(widths.items(), key=lambda kv: min(kv[1]))
    if rank > min(dims):
        raise ValueError(
            f"model.lora_rank={rank} exceeds the width of the smallest targeted layer, {name} "
            f"({' x '.join(map(str, dims))}): the adapter's update B A cannot have a rank above {min(dims)}. "
            f"Set model.lora_rank <= {min(dims)}"
        )


def apply_lora(
    model: torch.nn.Module, rank: int, alpha: float, dropout: float, targets: Any, seed: int, task: str = "CAUSAL_LM"
) -> torch.nn.Module:
    """``model`` with LoRA adapters (a ``peft.PeftModel``); only the adapters require grad (and, for ``task``
    ``SEQ_CLS``, a reward model, peft's trainable copy of the score head).

    The adapters are initialised from ``seed`` alone (B = 0, so the model starts as the base), so
    every data-parallel rank builds the same ones whatever its own RNG state.
    """
    from peft import LoraConfig, get_peft_model

    if targets != "all-linear":
        targets = [targets] if isinstance(targets, str) else list(targets)
        _check_targets(model, targets)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,  # pyright: ignore[reportArgumentType]  (annotated int; peft scales by alpha / r, a float works)
        lora_dropout=dropout,
        target_modules=targets,
        bias="none",
        task_type=task,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def peft_model_of(module: torch.nn.Module) -> Any:
    """The ``PeftModel`` inside ``module`` (a DDP wrapper keeps it in ``.module``), or None."""
    from peft import PeftModel

    inner = getattr(module, "module", module)
    return inner if isinstance(inner, PeftModel) else None


@contextmanager
def adapters_off(module: torch.nn.Module) -> Iterator[None]:
    """Within this block ``module`` computes as its base model (the reference policy)."""
    with peft_model_of(module).disable_adapter():
        yield


def _base_name(name: str) -> str:
    """A peft parameter name as the base model names it: ``base_model.model.`` and ``.base_layer`` dropped."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


@torch.no_grad()
def merged_weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weight of every adapted layer with its adapter merged in (W + scale * B A), under the
    base model's parameter names: what changes in the policy when the adapters train."""
    from peft.tuners.lora import LoraLayer

    out = {}
    for name, m in peft_model_of(module).named_modules():
        if isinstance(m, LoraLayer) and ADAPTER in m.lora_A:
            base = m.get_base_layer()
            out[_base_name(f"{name}.weight")] = (
                # every LoraLayer that wraps a weight defines get_delta_weight; peft declares it on the subclasses
                base.weight + m.get_delta_weight(ADAPTER).to(base.weight.dtype)  # pyright: ignore[reportAttributeAccessIssue]
            ).detach()
    return out


class MergedView:
    """What a rollout engine holding its own weights sees of a LoRA model: the base model (its
    config, name, generation config, parameters' device and dtype) whose ``state_dict`` has the
    base names with the adapters merged in (``merged=False``: the base weights alone, for an
    engine that applies the adapter itself)."""

    def __init__(self, module: torch.nn.Module, merged: bool = True) -> None:
        self._peft = peft_model_of(module)
        self._merged = merged

    def __getattr__(self, name: str) -> Any:
        return getattr(self._peft.get_base_model(), name)

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self._peft.get_base_model().parameters()

    @torch.no_grad()
    def state_dict(self) -> dict[str, torch.Tensor]:
        merged = merged_weights(self._peft) if self._merged else {}
        out = {}
        for k, v in self._peft.state_dict().items():
            if ".lora_" in k:
                continue
            name = _base_name(k)
            out[name] = merged.get(name, v)
        return out


def save_adapter(module: torch.nn.Module, directory: Path) -> None:
    """The adapter in peft's format (``adapter_config.json``, ``adapter_model.safetensors``)."""
    peft_model_of(module).save_pretrained(str(directory), safe_serialization=True)


def adapter_settings(directory: Path) -> dict[str, Any]:
    """rank, alpha and target modules of a saved adapter (empty when ``directory`` holds none)."""
    f = Path(directory) / "adapter_config.json"
    if not f.exists():
        return {}
    c = json.loads(f.read_text())
    targets = c.get("target_modules")
    return {
        "lora_rank": c.get("r"),
        "lora_alpha": c.get("lora_alpha"),
        "lora_target_modules": sorted(targets) if isinstance(targets, list) else targets,
    }


def load_adapter_state(directory: Path) -> dict[str, torch.Tensor]:
    """A saved adapter's tensors under the names the live ``PeftModel`` gives them (peft drops the
    adapter's name when saving: ``lora_A.weight`` is ``lora_A.default.weight`` in the model)."""
    from safetensors.torch import load_file

    state = load_file(str(Path(directory) / "adapter_model.safetensors"))
    return {
        k.replace(".lora_A.weight", f".lora_A.{ADAPTER}.weight").replace(
            ".lora_B.weight", f".lora_B.{ADAPTER}.weight"
        ): v
        for k, v in state.items()
    }


def check_resume(directory: Path, model_cfg: Any, module: torch.nn.Module | None, checkpoint: Path) -> None:
    """A checkpoint resumes only into a run with the same LoRA settings: say which one differs.

    :param module: the live actor model (its ``PeftModel`` gives the target modules as resolved,
        e.g. what 'all-linear' became), or None without LoRA.
    """
    saved = adapter_settings(directory)
    if not saved and model_cfg.lora_rank:
        raise LoraResumeError(
            f"checkpoint {checkpoint} holds a full model (no {ADAPTER_DIR}/), but "
            f"model.lora_rank={model_cfg.lora_rank}: resume with model.lora_rank=0, or start a new run_dir for the "
            "LoRA run"
        )
    if saved and not model_cfg.lora_rank:
        raise LoraResumeError(
            f"checkpoint {checkpoint} holds a LoRA adapter (rank {saved['lora_rank']}), but model.lora_rank=0: "
            f"resume with model.lora_rank={saved['lora_rank']}"
        )
    if not saved:
        return
    assert module is not None  # a LoRA run passes its live model
    live = peft_model_of(module).peft_config[ADAPTER].target_modules
    mine = {
        "lora_rank": model_cfg.lora_rank,
        "lora_alpha": float(model_cfg.lora_alpha),
        "lora_target_modules": sorted(live),
    }
    saved["lora_alpha"] = float(saved["lora_alpha"])
    for key, value in mine.items():
        if saved[key] != value:
            raise LoraResumeError(
                f"checkpoint {checkpoint} was trained with model.{key}={saved[key]}, this run has model.{key}={value}: "
                f"resume with model.{key}={saved[key]}"
            )


def base_manifest(base: Path) -> dict[str, Any]:
    """Size and fingerprint of each safetensors file of the base model directory ``base`` (see the module docstring)."""
    files = {}
    for f in sorted(Path(base).glob("*.safetensors")):
        size = f.stat().st_size
        h = hashlib.sha256()
        with open(f, "rb") as fh:
            data_start = 8 + min(int.from_bytes(fh.read(8), "little"), size)
            fh.seek(0)
            h.update(fh.read(data_start + _EDGE_BYTES))  # the header, then the first MiB of data
            fh.seek(max(data_start, size - _EDGE_BYTES))
            h.update(fh.read(_EDGE_BYTES))
        files[f.name] = {"size": size, "fingerprint": h.hexdigest()}
    return {"format": 1, "files": files}


def write_base_manifest(adapter: Path, base: Path) -> None:
    """Record beside the adapter saved in ``adapter`` which base (``base``, a model directory) it was trained on."""
    (Path(adapter) / BASE_MANIFEST).write_text(json.dumps(base_manifest(base), indent=1))


def base_problem(adapter: Path, base: Path) -> str | None:
    """What differs between the base recorded beside ``adapter`` and the model directory ``base``,
    or None (also when nothing was recorded: an adapter saved by an older ARMOR or by peft)."""
    f = Path(adapter) / BASE_MANIFEST
    if not f.is_file():
        return None
    try:
        saved = json.loads(f.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return f"{f} is damaged (not the JSON ARMOR writes)"
    now = base_manifest(base)["files"]
    for name in sorted(set(saved) | set(now)):
        before, after = saved.get(name), now.get(name)
        if before is None or after is None:
            return f"{name} {'is new in' if before is None else 'is missing from'} {base}"
        if before.get("size") != after["size"]:
            return f"{base / name} has {after['size']} bytes, the adapter's base had {before.get('size')}"
        if before.get("fingerprint") != after["fingerprint"]:
            return f"{base / name} holds other weights than the adapter's base (same size, different bytes)"
    return None
