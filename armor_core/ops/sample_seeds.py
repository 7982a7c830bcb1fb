"""Per-sample seeds: each sample's randomness derives from (run seed, epoch, row, sample index), not from a generator
shared by the batch.

A sampler that draws from one generator for the whole batch gives a row other tokens when the batch around it
changes: another ``rollout.micro_batch_size``, rows split over another number of rollout workers, generated ahead in
``rollout.mode=async``, or rows that finish early and stop drawing. With a seed per sample, a row's tokens depend on
that row alone: the prompt loader gives every row of a batch ``sample_seed`` (``PromptLoader.next_samples``), a
64-bit mix of ``trainer.seed``, the epoch, the row's dataset index and its sample index among its ``rollout.n``
copies, and the ``hf`` backend draws the token at decoding step ``t`` by inverse CDF from ``uniform(seed, t)``, a
counter-based draw (the ``vllm`` backend gives each row's request the seed, so vLLM uses a generator of the request's
own). A multi-turn episode's turn ``k`` samples with ``mix(seed, k)``. So a rerun is identical, the ``n`` samples of
a row differ, and the same rows give the same samples whatever the micro-batch size, worker count or mode.

The mix is SplitMix64 (Steele, Lea and Flood, 2014), computed in numpy's ``uint64`` (wrapping arithmetic).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["SEED_KEY", "mix", "repeat_samples", "row_seeds", "uniform"]

#: the prompts' per-row seed, int64 (bs,)
SEED_KEY = "sample_seed"

_GOLDEN, _M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def mix(seeds: np.ndarray | torch.Tensor | int, *parts: np.ndarray | torch.Tensor | int) -> torch.Tensor:
    """int64 seeds from ``seeds`` and each of ``parts`` (scalars or arrays broadcast against them), each folded in by
    one SplitMix64 round: equal inputs give equal seeds, and changing any part changes all 64 bits."""

    def u64(v: np.ndarray | torch.Tensor | int) -> np.ndarray:
        arr = v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
        return arr.astype(np.int64).view(np.uint64) if arr.dtype != np.uint64 else arr

    z = _splitmix(u64(seeds))
    for part in parts:
        with np.errstate(over="ignore"):
            z = _splitmix(z ^ u64(part))
    return torch.from_numpy(np.ascontiguousarray(z).view(np.int64))


def row_seeds(run_seed: int, epoch: int, uid: np.ndarray, n: int) -> torch.Tensor:
    """The seeds of a batch's rows repeated ``n`` times interleaved (a, a, b, b): row ``uid`` (its dataset index) of
    epoch ``epoch``, sample ``j`` of its ``n``."""
    uid = np.repeat(np.asarray(uid, dtype=np.int64), n)
    return mix(run_seed, epoch, uid, np.tile(np.arange(n, dtype=np.int64), len(uid) // max(n, 1)))


def uniform(seeds: torch.Tensor, step: int) -> torch.Tensor:
    """One float64 uniform in [0, 1) per seed for decoding step ``step``: the top 53 bits of ``mix(seed, step)``."""
    bits = mix(seeds.cpu(), step).numpy().view(np.uint64) >> np.uint64(11)
    return torch.from_numpy(bits.astype(np.float64) * 2.0**-53).to(seeds.device)


def repeat_samples(prompts: Any, n: int) -> Any:
    """A DataProto's rows repeated ``n`` times interleaved (a, a, b, b); rows carrying a ``sample_seed`` give each
    copy a seed of its own, ``mix(seed, j)`` for copy ``j``, so the n samples of a row differ."""
    if n <= 1:
        return prompts
    out = prompts.repeat(n, interleave=True)
    if SEED_KEY in out.tensors:
        seeds = out.tensors[SEED_KEY]
        out[SEED_KEY] = mix(seeds, np.tile(np.arange(n, dtype=np.int64), len(seeds) // n))
    return out
