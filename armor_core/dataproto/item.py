"""``DataProtoItem``: one row of a DataProto, as ``data[i]`` returns it (verl's name and shape).

A row drops the batch dimension, as indexing a tensor with an int does: ``item.batch["responses"]``
has shape ``(response_length,)`` and ``item.non_tensor_batch["data_source"]`` is the row's value,
so a loop written against verl's ``DataProto`` (``for i in range(len(data)): item = data[i]; ...``,
the shape of verl's per-row reward managers) runs unchanged. The tensors are views into the batch.
A slice (``data[i:i + 1]``) keeps the row dimension and is a DataProto.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from armor_core.dataproto.rules import unknown_key

__all__ = ["DataProtoItem"]


@dataclass
class DataProtoItem:
    """One row: ``batch`` (tensor name -> the row's tensor), ``non_tensor_batch`` (name -> the row's
    value) and the batch's ``meta_info`` (shared with it, as verl shares it)."""

    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        """``batch`` under ARMOR's name."""
        return self.batch

    @property
    def non_tensors(self) -> dict[str, Any]:
        """``non_tensor_batch`` under ARMOR's name."""
        return self.non_tensor_batch

    def __getitem__(self, key: str) -> Any:
        """The row's value of column ``key`` (tensor or non-tensor)."""
        if key in self.batch:
            return self.batch[key]
        if key in self.non_tensor_batch:
            return self.non_tensor_batch[key]
        raise KeyError(unknown_key("column", key, [*self.batch, *self.non_tensor_batch]))

    def __contains__(self, key: object) -> bool:
        return key in self.batch or key in self.non_tensor_batch
