"""Mixture-of-experts models: finding their routers, and what the routing did in a step.

transformers' MoE models (DeepSeek-V3, Qwen3-MoE, ...) route each token with a router module whose class name ends
in ``TopkRouter`` / ``TopKRouter`` and whose forward returns ``(router_logits, weights, indices)``: ``indices``
(tokens, top_k) the experts chosen. ``RouterWatch`` hooks every router of a model while the actor's training forward
runs and counts the tokens each expert received, per layer; ``metrics`` then gives, averaged over the MoE layers:

* ``moe/load_max`` and ``moe/load_min``: the busiest and the idlest expert's share of the layer's assignments, times
  the number of experts (1 is perfect balance; ``E`` means one expert took everything);
* ``moe/load_entropy``: the entropy of the layer's load over its experts, divided by ``log E`` (1: balanced, 0: one
  expert); the signal of expert collapse;
* ``moe/experts_unused``: the share of experts that received no token.

The models transformers implements route every token to its ``top_k`` experts (no capacity, so no token is dropped);
a model that drops tokens is not counted differently. In the padded layout the padding positions are routed too, and
counted; the packed layouts the actor uses where the model allows carry none.
"""

from __future__ import annotations

import math
import re
from contextlib import contextmanager
from typing import Any, Iterator

import torch

__all__ = ["RouterWatch", "hooked", "is_moe", "routers"]

_ROUTER = re.compile(r"Top[kK]Router$")


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's router modules, in layer order."""
    return [m for m in model.modules() if _ROUTER.search(type(m).__name__)]


def is_moe(model: torch.nn.Module) -> bool:
    """Whether the model routes tokens to experts (has a router)."""
    return bool(routers(model))


@contextmanager
def hooked(found: list[torch.nn.Module], hook: Any) -> Iterator[None]:
    """Forward hook ``hook(layer)`` on each router of ``found`` (``routers``) while open, removed after."""
    handles = [r.register_forward_hook(hook(i)) for i, r in enumerate(found)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class RouterWatch:
    """Counts, per router, the tokens each expert received while ``watch()`` is open (see the module docstring)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.routers = routers(model)
        self.counts: dict[int, torch.Tensor] = {}

    @contextmanager
    def watch(self) -> Iterator[None]:
        with hooked(self.routers, self._hook):
            yield

    def _hook(self, layer: int) -> Any:
        def count(_module: torch.nn.Module, _args: Any, out: Any) -> None:
            logits, indices = out[0], out[-1]
            experts = logits.shape[-1]
            # counted where the router ran, read back once per step (``metrics``), not once per forward
            got = torch.bincount(indices.detach().reshape(-1), minlength=experts).double()
            self.counts[layer] = self.counts[layer] + got if layer in self.counts else got

        return count

    def metrics(self) -> dict[str, float]:
        """The load statistics since the last call (``{}`` for a dense model, or when nothing was routed)."""
        counts, self.counts = [c.cpu() for c in self.counts.values()], {}
        counts = [c for c in counts if c.sum() > 0]
        if not counts:
            return {}
        stats = []
        for c in counts:
            experts, share = len(c), c / c.sum()
            entropy = float(-(share[share > 0] * share[share > 0].log()).sum()) / math.log(experts)
            stats.append(
                (float(share.max()) * experts, float(share.min()) * experts, entropy, float((c == 0).double().mean()))
            )
        names = ("moe/load_max", "moe/load_min", "moe/load_entropy", "moe/experts_unused")
        return {name: sum(s[i] for s in stats) / len(stats) for i, name in enumerate(names)}
