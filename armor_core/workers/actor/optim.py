"""The actor's optimizer and what one optimizer step is measured by: AdamW, the probe that tells
whether rows with zero advantage can be left out of the forward, and the size of an update (the
``step`` guard stage's statistics)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from armor_core.interfaces import call_with_params
from armor_core.workers.parallel.strategy import local_part

__all__ = ["adamw", "local_params", "update_stats", "zero_advantage_is_inert"]


def adamw(model: torch.nn.Module, **kwargs: Any) -> torch.optim.AdamW:
    """AdamW, fused (one kernel for all parameters; ~5x faster than the per-tensor loop torch
    defaults to on CPU) where torch supports it, else its multi-tensor ``foreach`` form."""
    params = [p for p in model.parameters() if p.requires_grad]  # with LoRA, the adapters only
    plain = all(
        type(p) is torch.nn.Parameter and p.dtype.is_floating_point and p.device.type in ("cpu", "cuda") for p in params
    )
    if plain:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    return torch.optim.AdamW(params, foreach=True, **kwargs)


def zero_advantage_is_inert(policy_loss: Callable[..., Any], actor: Any) -> bool:
    """Whether ``policy_loss`` is 0, with gradient 0, wherever the advantage is 0 (tried once, on
    random log-probs both on and off policy, with ``actor``'s clip ratios and
    ``policy_loss_kwargs``): then such rows need no forward."""
    g = torch.Generator().manual_seed(0)
    log_prob = (torch.randn(4, 5, generator=g) - 2).requires_grad_(True)
    old = torch.cat([log_prob.detach()[:2], log_prob.detach()[2:] + 0.3 * torch.randn(2, 5, generator=g)])
    params = {
        "clip_ratio_low": actor.clip_ratio_low,
        "clip_ratio_high": actor.clip_ratio_high,
        "clip_ratio_c": actor.clip_ratio_c,
    }
    try:
        loss_mat, _ = call_with_params(
            policy_loss,
            log_prob,
            old,
            torch.zeros(4, 5),
            torch.ones(4, 5),
            available=params,
            extra=actor.policy_loss_kwargs,
            where="actor.policy_loss_kwargs",
        )
        (grad,) = torch.autograd.grad(loss_mat.sum(), log_prob, allow_unused=True)
    except Exception:  # noqa: BLE001 - a loss that cannot take this probe is simply not skipped
        return False
    return bool((loss_mat == 0).all()) and (grad is None or bool((grad == 0).all()))


def local_params(model: torch.nn.Module, clone: bool = False) -> list[torch.Tensor]:
    """This rank's trainable parameter tensors (its shards under FSDP2), optionally copied."""
    out = [local_part(p.detach()) for p in model.parameters() if p.requires_grad]
    return [t.clone() for t in out] if clone else out


def update_stats(model: torch.nn.Module, before: list[torch.Tensor], sharded: bool, lr: float) -> dict[str, float]:
    """Size of the update just applied, over all parameters (summed over the ranks' shards when
    ``sharded``): ``update_ratio``, ``update_norm``, ``param_norm``, and the base ``lr``."""
    now = local_params(model)
    sq = torch.stack(
        [
            torch.stack(torch._foreach_norm(torch._foreach_sub(now, before))).double().pow(2).sum(),
            torch.stack(torch._foreach_norm(before)).double().pow(2).sum(),
        ]
    )
    if sharded:
        import torch.distributed as dist

        dist.all_reduce(sq)
    update, param = sq.sqrt().tolist()
    return {"update_ratio": update / max(param, 1e-30), "update_norm": update, "param_norm": param, "lr": lr}
