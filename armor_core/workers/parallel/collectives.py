"""What data-parallel ranks agree on, shared by the actor and the critic workers.

Every function is a no-op (or a local computation) with one rank; with several, it is a collective
that every rank must call in the same order. Sums are float64 so that counts and losses reduced
over ranks do not depend on the order of the additions.
"""

from __future__ import annotations

import math

import torch

__all__ = ["agreed_norm", "equal_micro_batches", "global_counts", "global_sums", "init_distributed", "mismatch_stats"]


def init_distributed(device: torch.device, rank: int, world_size: int) -> None:
    """Join the ranks' process group (gloo on CPU, NCCL on GPU), once per process. A group of one
    (FSDP2 offload on one GPU) has no launcher that set MASTER_ADDR/PORT: it picks a local port."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if world_size == 1:
        from armor_core.engine import free_port

        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    else:
        dist.init_process_group(backend, rank=rank, world_size=world_size)


def global_sums(xs: list[float], world_size: int) -> list[float]:
    """``xs`` summed element-wise over the ranks."""
    if world_size == 1:
        return xs
    import torch.distributed as dist

    t = torch.tensor(xs, dtype=torch.float64)
    dist.all_reduce(t)
    return t.tolist()


def global_counts(mask: torch.Tensor, world_size: int) -> tuple[float, float]:
    """(valid tokens, sequences with at least one) in ``mask`` (rows, T) over every rank: the loss
    aggregation divides by the whole batch's counts, so each rank's share sums to the batch's loss."""
    tokens, seqs = global_sums([mask.sum().item(), (mask.sum(-1) > 0).sum().item()], world_size)
    return float(tokens), float(seqs)


def agreed_norm(norm: float, world_size: int, sharded: bool) -> float:
    """The gradient norm every rank acts on: NaN if any rank's is not finite, else the largest.

    After DDP's all-reduce the gradients should be equal on every rank, but a fault after it (a NaN
    from a bad kernel, a bit flip) hits one rank only; a rank that skipped alone would leave its
    weights behind the others' for good. FSDP2's norm (``sharded``) is already one global number.
    """
    if world_size == 1 or sharded:
        return norm
    import torch.distributed as dist

    t = torch.tensor([0.0 if math.isfinite(norm) else 1.0, norm if math.isfinite(norm) else 0.0], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float("nan") if t[0] > 0 else float(t[1])


def mismatch_stats(
    train_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor, world_size: int
) -> dict[str, float]:
    """Mean and max ``|log pi_train - log pi_rollout|`` over valid tokens of every rank."""
    diff = (train_lp - rollout_lp).abs() * mask
    total, count, mx = diff.sum().item(), mask.sum().item(), diff.max().item() if diff.numel() else 0.0
    if world_size > 1:
        import torch.distributed as dist

        total, count = global_sums([total, count], world_size)
        m = torch.tensor([mx], dtype=torch.float64)
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        mx = float(m[0])
    return {"rollout/logprob_diff_mean": total / max(count, 1.0), "rollout/logprob_diff_max": mx}


def equal_micro_batches(micro: list[tuple[torch.Tensor, float]], world_size: int) -> list[tuple[torch.Tensor, float]]:
    """``micro`` ((row indices, weight) per micro-batch) padded to the largest count over ranks
    with stand-ins (one row at weight 0): DDP and FSDP2 communicate in every backward, so every
    rank must run as many as the others."""
    if world_size == 1:
        return micro
    import torch.distributed as dist

    n = torch.tensor([len(micro)])
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    return micro + [(torch.zeros(1, dtype=torch.long), 0.0)] * (int(n) - len(micro))
