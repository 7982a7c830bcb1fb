"""Starting the ``vllm`` rollout backend's engine: the backend's own options in
``rollout.backend_kwargs`` checked, the ``vllm.LLM`` arguments built from them, the model and the
platform, and an engine start that leaves the process as it was.

Why each default is what it is: the module docstring of ``armor_plugins.rollout.vllm``. Nothing
here imports vLLM; the caller passes the module and its platform in.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
from typing import Any, Iterator

import torch

from armor_core.models.lora import MergedView, peft_model_of
from armor_core.models.remote_code import runs_directory_code
from armor_plugins.rollout.common import kept_bound

__all__ = ["LORA_MODES", "backend_options", "engine_arguments", "start_engine"]

_CPU_KV_CACHE_BYTES = 1 << 30
LORA_MODES = ("merged", "adapter")
_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vllm.config.lora.MaxLoRARanks


def backend_options(kwargs: dict[str, Any], platform: Any, model: torch.nn.Module) -> tuple[int, str, Any]:
    """``(sleep_level, lora_mode, model's PeftModel or None)``: the backend's own options, popped
    from ``kwargs`` (a copy of ``rollout.backend_kwargs``) and checked against ``platform`` and ``model``."""
    lora_mode_given = "lora_mode" in kwargs
    can_sleep = platform.is_sleep_mode_available() and kwargs.get("enable_sleep_mode", True) is not False
    sleep_level = int(kwargs.pop("sleep_level", 1 if can_sleep else 0))
    if sleep_level not in (0, 1, 2):
        raise ValueError(
            f"rollout.backend_kwargs.sleep_level={sleep_level}: expected 0 (never sleep), 1 (weights to host "
            "memory, KV cache freed) or 2 (both freed)"
        )
    if sleep_level and not can_sleep:
        why = (
            "enable_sleep_mode is false"
            if platform.is_sleep_mode_available()
            else f"vLLM has no sleep mode on this platform ({platform.device_type})"
        )
        raise ValueError(f"rollout.backend_kwargs.sleep_level={sleep_level}: {why}; set sleep_level to 0")
    lora_mode = kwargs.pop("lora_mode", "merged")
    if lora_mode not in LORA_MODES:
        raise ValueError(f"rollout.backend_kwargs.lora_mode={lora_mode!r}: expected one of {LORA_MODES}")
    peft = peft_model_of(model)
    if peft is None and lora_mode_given:
        raise ValueError(
            f"rollout.backend_kwargs.lora_mode={lora_mode!r} is for LoRA runs, but the model has no adapters: "
            "set model.lora_rank > 0 or drop lora_mode"
        )
    return sleep_level, lora_mode, peft


def engine_arguments(
    model: torch.nn.Module | MergedView,
    config: Any,
    kwargs: dict[str, Any],
    sleep_level: int,
    platform: Any,
    adapter: Any = None,
) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments: this backend's defaults for ``platform``, vLLM's LoRA support when
    it serves the ``adapter`` (a ``PeftModel``), and ``kwargs`` (the rest of ``rollout.backend_kwargs``) over them."""
    if kwargs.get("logprobs_mode", "raw_logprobs") != "raw_logprobs":
        raise ValueError(
            f"rollout.backend_kwargs.logprobs_mode={kwargs['logprobs_mode']!r}: this backend needs 'raw_logprobs' "
            "(see the module docstring) and sets it itself"
        )
    engine_kwargs: dict[str, Any] = {
        "model": kwargs.pop("model", None) or _model_dir(model),
        "dtype": str(_engine_dtype(model)).removeprefix("torch."),
        "seed": 0,
        "skip_tokenizer_init": True,  # prompts go in as token ids and responses come out as ids
        "generation_config": "vllm",  # no defaults from generation_config.json (top_k=50, penalties, ...)
        "logprobs_mode": "raw_logprobs",
        "max_num_seqs": int(config.micro_batch_size),
        "enable_sleep_mode": bool(sleep_level),
        # the engine reloads the model's directory: it may run the directory's code only if the actor's model was
        # built from it, which ARMOR allows only with model.trust_remote_code=true
        "trust_remote_code": runs_directory_code(model),
    }
    # a truncated draw's kept set and mass come from each position's top log-probs (``vllm_outputs.py``); the ceiling
    # only validates requests (the sampler computes as many as a batch asks for)
    engine_kwargs["max_logprobs"] = max(20, int(getattr(config, "top_k", 0)), kept_bound(config))
    if platform.is_cpu():
        engine_kwargs["enforce_eager"] = True
        if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            engine_kwargs["kv_cache_memory_bytes"] = _CPU_KV_CACHE_BYTES
    else:
        engine_kwargs["gpu_memory_utilization"] = 0.5
    if adapter is not None:
        rank = int(next(iter(adapter.peft_config.values())).r)
        fits = [r for r in _VLLM_LORA_RANKS if r >= rank]
        if not fits:
            raise ValueError(
                f"rollout.backend_kwargs.lora_mode='adapter': vLLM serves LoRA ranks up to {_VLLM_LORA_RANKS[-1]}, "
                f"this model's is {rank}; use lora_mode='merged'"
            )
        engine_kwargs.update(enable_lora=True, max_lora_rank=fits[0], max_loras=1)
    engine_kwargs.update(kwargs)
    return engine_kwargs


def start_engine(vllm: Any, engine_kwargs: dict[str, Any]) -> Any:
    """``vllm.LLM(**engine_kwargs)``, started without changing the process's RNG states or threads."""
    # without a tokenizer vLLM logs "Chat template warmup failed" with a traceback; nothing failed.
    # A filter, not a level: vLLM reconfigures its loggers while it starts, which resets levels.
    renderer_log = logging.getLogger("vllm.renderers.base")
    renderer_log.addFilter(_drop_chat_template_warmup)
    try:
        with _preserved_process_state():
            return vllm.LLM(**engine_kwargs)
    finally:
        renderer_log.removeFilter(_drop_chat_template_warmup)


def _engine_dtype(model: torch.nn.Module | MergedView) -> torch.dtype:
    """The dtype the engine computes in: the autocast dtype when the backend is built under autocast
    (the actor keeps float32 master weights and computes in ``model.dtype``), else the weights' dtype."""
    device_type = next(model.parameters()).device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return next(model.parameters()).dtype


def _model_dir(model: Any) -> str:
    path = getattr(model, "name_or_path", "") or getattr(getattr(model, "config", None), "_name_or_path", "")
    if not path or not os.path.isfile(os.path.join(str(path), "config.json")):
        raise ValueError(
            f"vllm rollout: the engine loads the model from its directory, but this model's name_or_path is {path!r}, "
            "not a local directory with config.json. Load the model with armor_core.models.loading.load_model(DIR) "
            "(or save_pretrained(DIR) first), or set rollout.backend_kwargs.model=DIR"
        )
    return str(path)


@contextlib.contextmanager
def _preserved_process_state() -> Iterator[None]:
    """Restore what vLLM changes process-wide while it starts: RNG states, torch's thread count."""
    import numpy as np

    py_state, np_state = random.getstate(), np.random.get_state()
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    try:
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
        torch.set_num_threads = set_threads
        set_threads(threads)


def _drop_chat_template_warmup(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Chat template warmup failed")
