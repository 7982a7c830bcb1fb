"""Pieces shared by the worker processes: isolation and seeding at start-up, micro-batches, metrics.
(The forward layouts and response log-probs are ``workers/forward/layouts.py``.)
"""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np
import torch

if TYPE_CHECKING:
    from armor_core.config.schema import ArmorConfig

__all__ = [
    "add_metric",
    "build_on_one_thread",
    "isolate",
    "iter_micro_batches",
    "memory_metrics",
    "micro_batches",
    "quiet_transformers",
    "reset_memory_peaks",
    "scalar",
    "seed_everything",
]


def isolate(assignment: dict | None, cfg: ArmorConfig, rank: int) -> dict:
    """First thing in a worker: take the cores and GPUs the ProcessIsolator planned for it."""
    from armor_core.engine.isolation import Assignment, apply_assignment

    if assignment is not None:
        return apply_assignment(
            Assignment(
                assignment["group"],
                assignment["rank"],
                tuple(assignment["cpus"]),
                tuple(assignment["gpus"]),
                assignment.get("node", ""),
            ),
            cfg.trainer.seed,
        )
    threads = max(1, int(cfg.engine.cpus_per_worker or 1))
    torch.set_num_threads(threads)
    return {"pid": os.getpid(), "rank": rank, "threads": threads, "isolated": False}


def build_on_one_thread() -> Callable[[], None]:
    """Run a worker's construction on one torch thread; call the returned function at its end.

    The driver's calls reach a worker on a thread of its own (the direct channel), not the thread
    that built it. OpenMP (libgomp) keeps a pool of threads per thread that starts a parallel
    region, and once its pools hold more threads than the process has cores it stops letting idle
    threads spin: every later parallel region then waits for threads to wake up. A multi-threaded
    forward while building (a model check, a copy) made every step of the default run 2.7x slower.
    Built on one thread, the main thread never starts a pool; the calls' thread gets the
    configured count (torch's thread count is process-wide and each thread applies it lazily)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    return lambda: torch.set_num_threads(threads)


def quiet_transformers() -> None:
    """No per-worker progress bars for loading a model: they interleave on the driver's console."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def seed_everything(seed: int, deterministic: bool = True) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def iter_micro_batches(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def micro_batches(
    lengths: torch.Tensor, rows: int, max_tokens: int | None = None, key: str = "max_tokens_per_micro_batch"
) -> list[torch.Tensor]:
    """Positions (into ``lengths``, the real tokens of each row) of each micro-batch: ``rows`` rows
    at a time, or with ``max_tokens``, consecutive rows while their tokens fit in it.

    Consecutive, not sorted by length: a GRPO group's rows stay together, so the grouped layout
    can still share their prompt. The result of the update does not depend on the split (the loss
    aggregation divides by global counts), only its peak memory does.

    :raises ValueError: a row longer than ``max_tokens``, naming ``key``, the row and the smallest budget that works.
    """
    if not max_tokens:
        return [torch.arange(s.start, s.stop) for s in iter_micro_batches(len(lengths), rows)]
    counts = [int(n) for n in lengths.tolist()]
    longest = max(counts, default=0)
    if longest > max_tokens:
        raise ValueError(
            f"{key}={max_tokens} cannot hold row {counts.index(longest)} of this batch, which has {longest} tokens "
            f"(prompt + response); set it to at least {longest}"
        )
    out, start, used = [], 0, 0
    for i, n in enumerate(counts):
        if used + n > max_tokens:
            out.append(torch.arange(start, i))
            start, used = i, 0
        used += n
    if start < len(counts):
        out.append(torch.arange(start, len(counts)))
    return out


def scalar(x: torch.Tensor | float) -> float:
    return float(x.detach().float().item()) if isinstance(x, torch.Tensor) else float(x)


def add_metric(sums: dict[str, list[float]], key: str, value: torch.Tensor | float) -> None:
    """One value of a metric; ``update_actor`` reports each metric's mean (max / min for ``_max`` / ``_min``)."""
    sums.setdefault(key, []).append(scalar(value))


def memory_metrics(device: torch.device) -> dict[str, float]:
    """This process's memory high-water marks: ``perf/max_rss_gb`` (host, since the process began)
    and, on a GPU, ``perf/max_memory_allocated_gb`` / ``perf/max_memory_reserved_gb`` (the torch
    allocator's peaks since the last :func:`reset_memory_peaks`) and ``perf/gpu_memory_used_gb``
    (the whole device now, other allocators such as a sleeping vLLM engine's included)."""
    import resource

    out = {"perf/max_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        out.update(
            {
                "perf/max_memory_allocated_gb": torch.cuda.max_memory_allocated(device) / 1e9,
                "perf/max_memory_reserved_gb": torch.cuda.max_memory_reserved(device) / 1e9,
                "perf/gpu_memory_used_gb": (total - free) / 1e9,
            }
        )
    return out


def reset_memory_peaks(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
