"""A model's weights handed over a bucket at a time: what a weight sync sends to an engine with weights of its own
(``workers/actor/weights.py``) and what the ``vllm`` backend loads from its source model, without a whole gathered
copy of an FSDP2 model on any rank."""

from __future__ import annotations

from typing import Iterator

import torch

__all__ = ["full_state_buckets"]


def full_state_buckets(model: torch.nn.Module, bucket_bytes: int) -> Iterator[dict[str, torch.Tensor]]:
    """The model's state dict, whole tensors, in buckets of at most ``bucket_bytes`` (a larger tensor alone).

    Under FSDP2 each tensor is gathered from the shards as its bucket fills (a collective: every rank iterates
    alike) and is freed once the caller moves on, so a rank holds one bucket of full tensors, never the whole
    model; otherwise the tensors are the model's own, nothing copied. A tensor shared under several names (a
    tied ``lm_head``) comes once, under its first name: whoever loads it shares it too.
    """
    bucket: dict[str, torch.Tensor] = {}
    held, seen = 0, set()
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen:
            continue
        seen.add(id(t))
        nbytes = t.numel() * t.element_size()
        if bucket and held + nbytes > bucket_bytes:
            yield bucket
            bucket, held = {}, 0
        if hasattr(t, "full_tensor"):  # a DTensor shard from FSDP2
            t = t.full_tensor()  # pyright: ignore[reportAttributeAccessIssue]  (a DTensor)
        bucket[name] = t.detach()
        held += nbytes
    if bucket:
        yield bucket
