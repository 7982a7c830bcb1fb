"""How a worker group splits a batch over its ranks and merges what they return.

``balanced_split`` gives each rank the same number of rows with token totals as even as possible;
``Pending`` is a call sent but not gathered yet, and its ``result`` merges the ranks' results:
DataProtos concatenated in the original row order, metric dicts by ``merge_metrics``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from armor_core.dataproto.metrics import merge_metrics

if TYPE_CHECKING:
    from ray import ObjectRef

    from armor_core.dataproto.protocol import DataProto
    from armor_core.engine.group import WorkerGroup

__all__ = ["Pending", "balanced_split", "shares"]


def balanced_split(token_counts: np.ndarray, n: int) -> list[np.ndarray]:
    """Split row indices into ``n`` groups of equal row count with token totals as even as possible.

    Rows are taken longest first and each goes to the lightest group that still has room (LPT
    scheduling), so each rank does about the same work; every group has len(rows)/n rows, because
    the gradient contract sums per-rank losses and DDP needs the same number of micro-batches.
    """
    rows = len(token_counts)
    if rows % n:
        raise ValueError(
            f"cannot split {rows} rows evenly over {n} workers; make the batch a multiple of the worker count"
        )
    cap = rows // n
    loads = np.zeros(n)
    groups: list[list[int]] = [[] for _ in range(n)]
    for i in np.argsort(-token_counts, kind="stable"):
        open_groups = [g for g in range(n) if len(groups[g]) < cap]
        g = min(open_groups, key=lambda k: loads[k])
        groups[g].append(int(i))
        loads[g] += token_counts[i]
    return [np.sort(np.array(g, dtype=np.int64)) for g in groups]


class Pending:
    """Calls sent to a group whose results are not gathered yet (``WorkerGroup.submit``,
    ``submit_call``, ``submit_pair``). ``parts``: for each DataProto the call split over the
    ranks, the row indices of each rank's share (None: ``call``, results returned as a list)."""

    def __init__(
        self, group: WorkerGroup, method: str, refs: list[ObjectRef] | int, parts: list[list[np.ndarray]] | None
    ) -> None:
        self.group, self.method, self.refs, self.parts = (
            group,
            method,
            refs,
            parts,
        )  # refs: Ray's, or the channel call's number

    def result(self) -> Any:
        """``call``'s list; ``dispatch``'s merge (DataProtos concatenated in the original row order,
        metric dicts averaged over ranks); ``submit_pair``'s pair of merges."""
        outs = self.group.gather(self.refs, self.method)
        if self.parts is None:
            return outs
        if len(self.parts) == 1:
            return _merge(outs, self.parts[0])
        return tuple(_merge([o[i] for o in outs], parts) for i, parts in enumerate(self.parts))


def _merge(outs: list[Any], parts: list[np.ndarray]) -> Any:
    from armor_core.dataproto.protocol import DataProto
    from armor_core.ops.sampling_replay import same_kept_width

    if len(outs) == 1:
        return outs[0]
    if isinstance(outs[0], DataProto):
        merged = DataProto.concat(same_kept_width(outs))  # merges meta_info["metrics"] by merge_metrics
        return merged[np.argsort(np.concatenate(parts))]
    if isinstance(outs[0], dict):
        return merge_metrics(outs)
    return outs


def shares(data: DataProto, n: int) -> list[np.ndarray]:
    """Each rank's rows of ``data``, balanced by valid tokens (responses once there are any)."""
    if n == 1:
        return [np.arange(len(data))]
    mask = data["response_mask"] if "response_mask" in data else data["attention_mask"]
    return balanced_split(mask.sum(-1).numpy(), n)
