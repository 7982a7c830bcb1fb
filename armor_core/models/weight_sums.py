"""Checking a weight sync (``rollout.verify_sync``): after the actor hands new weights to a rollout
engine, the engine reports sums of what it now holds and the actor compares them with the same sums
of what it sent, so a sync that silently failed (stale weights, a tensor never loaded, an adapter
that never reached the engine) stops the run instead of sampling from the wrong policy.

The sum (``weight_sum``): the float64 sum and sum of squares of a fixed strided sample of the
tensor, every ``ceil(K / SAMPLE_COLUMNS)``-th index of its last dimension (its input dimension, for
a linear layer's weight), all of a 1-D tensor. It is taken after rounding to the dtype the engine
holds the tensor in, on both sides, so both sum exactly the same numbers and the only difference is
the order of float64 additions: a tolerance of ``RTOL`` (1e-7) of the tensor's scale, whatever the
dtype. A bf16 engine is then held to its own rounding of the sent weights, bit for bit, not to a
bf16-sized tolerance: a stale bf16 copy differs wherever one step moved a weight across a rounding
step. Sampling whole index columns of the last dimension makes the sum the same for layouts an
engine builds from the trained tensors: rows stacked (vLLM's fused ``qkv_proj``, ``gate_up_proj``,
experts in one 3-D tensor), rows padded with zeros (a vocabulary rounded up). A change to weights
outside the sample is not seen; every failure named above changes every column.

The protocol: a backend's optional ``weight_sums(names)`` (``CAPABILITIES["rollout_backend"]``)
returns ``{key: HeldSum}`` for the trainer's tensor ``names``: a key per tensor (``hf``) or per
group of tensors the engine stores together (``vllm``: a decoder layer), each with the sum of what
the engine holds, the dtype to round to and the sent names it covers. ``check_sync`` compares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

import torch

from armor_core.errors import UserFacingError

__all__ = [
    "RTOL",
    "SAMPLE_COLUMNS",
    "HeldSum",
    "SyncCheckError",
    "WeightSum",
    "check_sync",
    "plain_name",
    "sample_columns",
    "sampled",
    "weight_sum",
]

#: index columns of a tensor's last dimension in its sum: a fraction of the weights read, yet every column
#: a failed sync leaves stale
SAMPLE_COLUMNS = 16
#: both sides sum the same rounded numbers in float64; only the order of additions differs, worth at most about
#: n * 2^-53 of the scale for n numbers: 1e-7 leaves room up to ~1e9 numbers in one key
RTOL = 1e-7
#: wrappers whose prefixes appear in parameter names sent by a trainer (DDP, torch.compile)
PREFIXES = ("module.", "_orig_mod.")
_SHOWN = 5  # mismatching keys named in the error


class SyncCheckError(UserFacingError):
    """After a weight sync the rollout engine does not hold what the actor sent: it would sample from
    another policy than the one trained. Names the tensors and how far they are off."""


@dataclass(frozen=True)
class WeightSum:
    """``n`` numbers sampled, their float64 ``total`` and sum of ``squares``; sums add over tensors."""

    n: int = 0
    total: float = 0.0
    squares: float = 0.0

    def __add__(self, other: WeightSum) -> WeightSum:
        return WeightSum(self.n + other.n, self.total + other.total, self.squares + other.squares)

    def mismatch(self, held: WeightSum) -> float:
        """How far ``held`` is from this sum, in units of the tolerance (over 1: a mismatch). The counts may differ:
        an engine's rows of zeros (a padded vocabulary) add numbers but nothing to the sums."""
        squares = max(self.squares, held.squares)
        if squares == 0.0:
            return 0.0
        scale = math.sqrt(
            max(self.n, held.n) * squares
        )  # at least sum(|x|) (Cauchy-Schwarz): what the additions' error scales with
        return max(abs(held.total - self.total) / scale, abs(held.squares - self.squares) / squares) / RTOL


@dataclass(frozen=True)
class HeldSum:
    """What a rollout engine holds under one key: the sum, the dtype the sent tensors are rounded to
    before theirs is taken, and the sent ``names`` the key covers."""

    sum: WeightSum
    dtype: torch.dtype
    names: tuple[str, ...]


def plain_name(name: str) -> str:
    """``name`` without the ``module.`` / ``_orig_mod.`` prefixes DDP or torch.compile put before it."""
    for prefix in PREFIXES:
        while name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def sample_columns(k: int) -> slice:
    """The sampled indices of a last dimension of size ``k``: every ``ceil(k / SAMPLE_COLUMNS)``-th."""
    return slice(0, k, max(1, -(-k // SAMPLE_COLUMNS)))


def sampled(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of the part of ``tensor`` its sum reads (the sampled columns; a 1-D tensor whole): what a sync that
    frees each tensor once sent keeps to check against. Sampling it again takes all of it, so its ``weight_sum``
    is the whole tensor's."""
    t = tensor.detach()
    return (t[..., sample_columns(t.shape[-1])] if t.ndim >= 2 else t).clone()


@torch.no_grad()
def weight_sum(tensor: torch.Tensor, dtype: torch.dtype | None = None, sample: bool = True) -> WeightSum:
    """The sum of ``tensor``'s sample (module docstring), rounded to ``dtype`` first when given; ``sample=False``
    sums all of it (columns an engine already sampled)."""
    if hasattr(tensor, "full_tensor"):  # a DTensor shard from FSDP2
        tensor = tensor.full_tensor()  # pyright: ignore[reportAttributeAccessIssue]  (a DTensor)
    t = tensor.detach()
    if sample and t.ndim >= 2:
        t = t[..., sample_columns(t.shape[-1])]
    if dtype is not None and t.is_floating_point():
        t = t.to(dtype)
    t = t.to(torch.float64)
    return WeightSum(t.numel(), float(t.sum()), float((t * t).sum()))


def check_sync(
    sent: Mapping[str, torch.Tensor],
    weight_sums: Callable[[list[str]], Mapping[str, HeldSum]],
    where: str,
    names: Iterable[str] | None = None,
) -> None:
    """Compare what a rollout engine holds after a sync with what was sent; raise ``SyncCheckError`` if not equal.

    :param sent: the policy's tensors by name, as the engine should now hold them (a key may need tensors that
        were not sent this time: a LoRA sync sends the adapted layers, a vLLM layer holds the norms too).
    :param weight_sums: the backend's ``weight_sums``.
    :param where: who synced to whom, for the message (``"actor rank 0 -> vllm"``).
    :param names: the names to check; default all of ``sent``.
    """
    asked = list(sent) if names is None else list(names)
    held = weight_sums(asked)
    covered = {n for h in held.values() for n in h.names}
    missing = [n for n in asked if n not in covered]
    bad: list[tuple[float, str]] = []
    for key, h in held.items():
        expected = WeightSum()
        for n in h.names:
            if n not in sent:
                missing.append(n)
                continue
            expected = expected + weight_sum(sent[n], h.dtype)
        if (off := expected.mismatch(h.sum)) > 1.0:
            bad.append(
                (
                    off,
                    f"{key} (sum {h.sum.total:.6g} vs sent {expected.total:.6g}, off by {off * RTOL:.2g} of its scale)",
                )
            )
    if not missing and not bad:
        return
    bad.sort(reverse=True)
    parts = []
    if bad:
        shown = "; ".join(text for _, text in bad[:_SHOWN])
        parts.append(f"{len(bad)} of {len(held)} tensors differ from what the actor sent: {shown}")
    if missing:
        parts.append(f"{len(missing)} sent tensors are not held by the engine: {missing[:_SHOWN]}")
    raise SyncCheckError(
        f"weight sync {where} failed: {'; '.join(parts)}. The engine would sample from another policy than the one "
        "trained (a backend whose update_weights skipped or lost tensors). rollout.verify_sync=false turns this "
        "check off"
    )
