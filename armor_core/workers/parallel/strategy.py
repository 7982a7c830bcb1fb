"""Data parallelism for the actor and critic workers: DDP or FSDP2, and checkpoints that any world size resumes.

Both strategies keep one contract (``hookspecs.armor_register_loss_aggregations``): each rank's
micro-batch losses are divided by *global* token/sequence counts, so their sum over ranks is the
full-batch loss. DDP all-reduces gradients with a mean and FSDP2 reduce-scatters them with a mean
too, so the workers multiply their loss by ``world_size`` and N ranks take the same step as one
rank on the same global batch (``tests/core/workers/parallel/test_parallel.py`` checks it, for every
aggregation mode).

- ``ddp``: every rank holds the whole model and optimizer state; gradients are all-reduced.
- ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` on every decoder layer (the model's
  ``_no_split_modules``) and on the root, so parameters, gradients and Adam moments are sharded
  (DTensors) and a layer's weights are all-gathered only around its forward and backward. Each
  forward of a sharded model is a collective, so the ``hf`` rollout generates from it with every
  rank in step (``actor.fsdp_generation=shards``: as many micro-batches and decoding steps on every
  rank, ``HFRollout.lockstep``), and ``reshard`` frees the root's gathered parameters afterwards;
  LoRA, async rollouts and other backends keep a full copy, refreshed after every update.

Checkpoints come in two forms (``actor.checkpoint_format``), both keyed by parameter *name*, so any
number of ranks with either strategy loads either one; each rank's RNG state is kept separately.

- full: the model state dict (a Hugging Face directory) and the optimizer state, gathered to rank 0
  (``torch.distributed.checkpoint.state_dict`` with ``full_state_dict=True``): one process holds all of it.
- sharded (``save_shards`` / ``load_shards``): ``torch.distributed.checkpoint`` (DCP), each rank writing
  the shards it holds, nothing gathered; on load DCP reads whatever slices of the saved shards this
  rank's layout needs (another world size reshards). Only tensors go in the shards (DCP would pickle
  anything else): the optimizer's ``param_groups`` (hyper-parameters and parameter names) are returned
  to the caller, who keeps them in its JSON state file and hands them back to ``load_shards``.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from concurrent.futures import Future
from typing import Any, cast

import torch

__all__ = [
    "STRATEGIES",
    "ShardWriter",
    "full_model_state",
    "full_optimizer_state",
    "load_full_model_state",
    "load_full_optimizer_state",
    "load_shards",
    "local_part",
    "reshard",
    "save_shards",
    "start_saving_shards",
    "shard_units",
    "wrap",
    "writes_shards",
]

STRATEGIES = ("ddp", "fsdp2")


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP2 shards one by one: those whose class the model lists in ``_no_split_modules``
    (the decoder layers of every transformers causal LM), searched in submodules too."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    units = [m for m in model.modules() if type(m).__name__ in names]
    if not units:
        raise ValueError(
            f"fsdp2: {type(model).__name__} names no decoder-layer class in _no_split_modules, so there is nothing "
            "to shard layer by layer; use actor.strategy=ddp for this model"
        )
    return units


def wrap(
    model: torch.nn.Module,
    strategy: str,
    world_size: int,
    device: torch.device,
    compute_dtype: torch.dtype = torch.float32,
    offload: bool = False,
) -> torch.nn.Module:
    """The module to train: ``model`` itself (one rank), a DDP wrapper, or ``model`` sharded in place by FSDP2.

    :param compute_dtype: below float32, FSDP2 gathers the (float32) parameters in this dtype for
        forward and backward and reduces gradients in float32 (``MixedPrecisionPolicy``); one rank
        and DDP get it from autocast instead (``precision.autocast``).
    :param offload: FSDP2 only (even on one rank): shards live in CPU memory (``CPUOffloadPolicy``).

    Call it after ``torch.distributed`` is initialised and before building the optimizer (FSDP2
    replaces the parameters with DTensors).
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}; one of {', '.join(STRATEGIES)}")
    if offload and strategy != "fsdp2":
        raise ValueError(f"offload needs strategy=fsdp2, not {strategy!r}")
    if world_size == 1 and not offload:
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index or 0] if device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": init_device_mesh(device.type, (world_size,))}
    if compute_dtype != torch.float32:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    if (
        offload
    ):  # it needs a backend that reduce-scatters CPU tensors, which gloo does not: GPU runs only (config checks)
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    for unit in shard_units(model):
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    return model


def reshard(model: torch.nn.Module) -> None:
    """Free every gathered parameter of an FSDP2 ``model``: after a forward without a backward (generation, a no-grad
    pass) the root module keeps its own (the embedding and the head) gathered, and those are not the parameters
    the optimizer holds."""
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def local_part(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: a DTensor's local shard (FSDP2), ``t`` itself otherwise; it shares ``t``'s storage."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _options(**kw: Any):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kw)


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict as plain CPU tensors on every rank (a collective under FSDP2)."""
    if not is_sharded(model):
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_options(full_state_dict=True, cpu_offload=False))
    return cast(dict[str, torch.Tensor], state)  # torch types any state's values; a model's are tensors


def load_full_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """Load a full state dict into ``model`` (sharded or not); returns (missing, unexpected) keys."""
    if not is_sharded(model):
        res = model.load_state_dict(state, strict=False)
        return list(res.missing_keys), list(res.unexpected_keys)
    from torch.distributed.checkpoint.state_dict import ValueType, set_model_state_dict

    res = set_model_state_dict(
        model, cast(dict[str, ValueType], state), options=_options(full_state_dict=True, strict=False)
    )
    return list(res.missing_keys), list(res.unexpected_keys)


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state keyed by parameter name, whole (gathered under FSDP2; a collective there).

    Keyed by name rather than by position, so it loads into any world size and either strategy.
    """
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    if (
        not optimizer.state
    ):  # no step taken yet; the API below would take a zero step to create state (Adam's step count 1)
        return {"untouched": optimizer.state_dict()}
    state = get_optimizer_state_dict(model, optimizer, options=_options(full_state_dict=is_sharded(model)))
    return _to_cpu(state)


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load :func:`full_optimizer_state`'s output; under FSDP2 each rank keeps its own shard of it."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    if "untouched" in state:  # hyper-parameters only, indexed by position: the same on any world size
        optimizer.load_state_dict(state["untouched"])
        return
    set_optimizer_state_dict(model, optimizer, state, options=_options(full_state_dict=is_sharded(model)))


def _to_cpu(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_cpu(v) for v in x)
    return x


def writes_shards(checkpoint_format: str, sharded: bool, lora: bool) -> bool:
    """Whether a worker checkpoints in the sharded form: ``actor.checkpoint_format`` sharded, or auto on a sharded
    (FSDP2, more than one rank) model; a LoRA run writes its small adapter, whole, either way."""
    return not lora and (checkpoint_format == "sharded" or (checkpoint_format == "auto" and sharded))


def save_shards(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: str, world_size: int
) -> dict[str, Any]:
    """Every rank writes its shards of the model's and the optimizer's tensors into ``directory`` (a collective
    when ``world_size`` > 1). Returns what the caller keeps in its JSON state for :func:`load_shards`: the
    optimizer's ``param_groups`` (by parameter name), or, before the first optimizer step (no state to write),
    its hyper-parameters as ``full_optimizer_state`` keeps them (``untouched``)."""
    import torch.distributed.checkpoint as dcp

    state, kept = _shard_state(model, optimizer)
    with _one_process_quiet():
        dcp.save(state, checkpoint_id=directory, no_dist=world_size == 1)
    return kept


def start_saving_shards(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: str, world_size: int, group: Any = None
) -> tuple[dict[str, Any], Future]:
    """:func:`save_shards` in the background: every rank copies its shards to host memory (before this returns, so
    training may change the tensors at once) and writes them from a thread; ``group`` is the process group the
    writers agree through (one of their own: the training's collectives go on meanwhile). Returns what
    :func:`save_shards` returns and the future of the write, which raises what the write raised."""
    import torch.distributed.checkpoint as dcp

    state, kept = _shard_state(model, optimizer)
    with _one_process_quiet():
        done = dcp.async_save(state, checkpoint_id=directory, process_group=group, no_dist=world_size == 1)
    return kept, cast(Future, done)


class ShardWriter:
    """A worker's sharded saves (:func:`save_shards`), in the foreground or started in the background
    (:func:`start_saving_shards`, ``trainer.async_save``); a save in flight is waited for before the next save or any
    load, and by :meth:`wait`, after which its files are whole."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._group: Any = None  # the background writers' own process group, made at the first background save
        self._pending: Future | None = None

    def save(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: str, background: bool = False
    ) -> dict[str, Any]:
        self.wait()
        if not background:
            return save_shards(model, optimizer, directory, self.world_size)
        # made now, not by the writer thread: what the caller writes beside the shards goes in at once
        os.makedirs(directory, exist_ok=True)
        if self._group is None and self.world_size > 1:  # every rank saves together: the group is made alike
            import torch.distributed as dist

            self._group = dist.new_group(backend="gloo")
        kept, self._pending = start_saving_shards(model, optimizer, directory, self.world_size, self._group)
        return kept

    def wait(self) -> float:
        """Wait for the save in flight, if any; raises what its write raised. Returns the seconds waited."""
        if self._pending is None:
            return 0.0
        import time

        t0 = time.perf_counter()
        pending, self._pending = self._pending, None
        pending.result()
        return time.perf_counter() - t0


def _shard_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """What :func:`save_shards` writes (the tensors) and what it returns (the rest)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state: dict[str, Any] = {"model": _once(get_model_state_dict(model))}
    kept: dict[str, Any] = {"untouched": optimizer.state_dict()}
    if optimizer.state:
        optim = get_optimizer_state_dict(model, optimizer)
        state["optimizer"], kept = optim["state"], {"param_groups": optim["param_groups"]}
    return state, kept


def load_shards(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: str, world_size: int, kept: dict[str, Any]
) -> None:
    """Load :func:`save_shards`' output into this rank's layout, whatever layout wrote it; ``kept`` is what it
    returned."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state: dict[str, Any] = {"model": _once(get_model_state_dict(model))}
    optim = None
    if "param_groups" in kept:  # the template: this rank's state tensors (created by a zero step when none exist yet)
        optim = get_optimizer_state_dict(model, optimizer)
        state["optimizer"] = optim["state"]
    with _one_process_quiet():
        dcp.load(state, checkpoint_id=directory, no_dist=world_size == 1)
    set_model_state_dict(model, state["model"], options=_options(strict=False))  # a tied tensor under one name
    if optim is not None:
        optim["param_groups"] = kept["param_groups"]
        set_optimizer_state_dict(model, optimizer, optim)
    else:
        optimizer.load_state_dict(kept["untouched"])


def _once(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with each tensor under its first name only: a tied head (``lm_head.weight``, the embedding's own
    storage) is written and read once, as the embedding."""
    seen: set[tuple] = set()
    out = {}
    for key, value in state.items():
        local = local_part(value)
        ident = (local.data_ptr(), tuple(local.shape), local.dtype) if local.numel() else None
        if ident is not None and ident in seen:
            continue
        if ident is not None:
            seen.add(ident)
        out[key] = value
    return out


@contextlib.contextmanager
def _one_process_quiet():
    """DCP warns that it "assumes" a single process when it runs without a group: here that is what was asked."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
