"""Routing replay (R3): the experts each token was routed to at rollout, reused in the trainer's forward.

A mixture-of-experts policy scores its tokens twice: once while it samples them (the rollout) and again in the
trainer (old log-probs, the update's forward). Each router picks its top-k experts per token, and a router score
near a tie flips under the smallest numeric difference between the two forwards (another batch shape, a KV cache,
another kernel): the token then goes through other experts and its log-prob differs by far more than rounding.
Replaying the rollout's choice removes that source of rollout/trainer mismatch (R3, "rollout routing replay").

* ``RouteRecorder`` watches every router of the rollout's model and gives the experts each forward chose,
  ``(tokens, layers, top_k)``; the hf backend places them per sequence position (``ROUTES``, ``(rows, T, layers,
  top_k)`` int16, -1 where nothing was recorded: padding, and a response's last token, whose hidden state
  predicts nothing scored).
* ``replaying(model, routes)`` makes every router of ``model`` use ``routes`` (flat, ``(tokens, layers, top_k)``,
  in the forward's token order; ``layout_routes`` lays a micro-batch's out for the padded or a packed layout):
  the chosen experts are the recorded ones, and their weights are recomputed from the router's own logits, so the
  router still learns. A token without a record keeps the router's own choice.
* ``check_replayable`` refuses, at start, a router whose weights ``expert_weights`` cannot recompute (a router
  family not known here), by comparing with the router's own output on random input.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch

from armor_core.models.moe import hooked, routers

__all__ = [
    "ROUTES",
    "RouteGrid",
    "RouteRecorder",
    "check_replayable",
    "expert_weights",
    "layout_routes",
    "replaying",
]

#: the rollout's routing, (rows, T, MoE layers, top_k) int16 over the whole sequence, -1 where not recorded
ROUTES = "rollout_routed_experts"


def expert_weights(router: torch.nn.Module, logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """The weights ``router`` gives the ``experts`` (tokens, top_k) from its ``logits`` (tokens, E), computed as it
    computes them for its own choice: sigmoid scores, normalised and scaled (DeepSeek-V3's routers: they carry an
    ``e_score_correction_bias``), or a softmax over every expert, normalised over the chosen ones when the router
    says ``norm_topk_prob`` (Qwen2-MoE, Qwen3-MoE and the like)."""
    if hasattr(router, "e_score_correction_bias"):
        weights = logits.sigmoid().gather(1, experts)  # in the logits' dtype, as the router (autocast may make it bf16)
        if getattr(router, "norm_topk_prob", False):
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * float(getattr(router, "routed_scaling_factor", 1.0))
    weights = torch.softmax(logits.float(), dim=-1).gather(1, experts)
    if getattr(router, "norm_topk_prob", False):
        weights = weights / weights.sum(-1, keepdim=True)
    return weights.to(logits.dtype)


@torch.no_grad()
def check_replayable(model: torch.nn.Module) -> None:
    """Raise ``ValueError`` naming the router when ``expert_weights`` does not reproduce a router's own weights
    (routing replay would then weight the replayed experts differently from how the model weights its own)."""
    for layer, router in enumerate(routers(model)):
        weight = router.weight
        assert isinstance(weight, torch.Tensor)
        hidden = torch.randn(8, weight.shape[1], dtype=weight.dtype, device=weight.device)
        logits, weights, experts = router(hidden)
        again = expert_weights(router, logits, experts)
        if again.shape != weights.shape or not torch.allclose(again.float(), weights.float(), atol=1e-5, rtol=1e-4):
            raise ValueError(
                f"rollout.routing_replay: the router of MoE layer {layer} ({type(router).__name__}) weights its "
                "experts in a way routing replay does not know (it knows DeepSeek-V3's sigmoid routers and softmax "
                "routers such as Qwen2/3-MoE's); set rollout.routing_replay=false for this model"
            )


class RouteRecorder:
    """The experts every router of ``model`` chose, forward by forward, while ``recording()`` is open."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.routers = routers(model)
        self._chosen: dict[int, torch.Tensor] = {}

    @contextmanager
    def recording(self) -> Iterator[None]:
        try:
            with hooked(self.routers, self._hook):
                yield
        finally:
            self._chosen = {}

    def _hook(self, layer: int) -> Any:
        def keep(_module: torch.nn.Module, _args: Any, out: Any) -> None:
            self._chosen[layer] = out[-1].detach()

        return keep

    def take(self, rows: int) -> torch.Tensor:
        """(rows, length, layers, top_k) int16: the last forward's choice for its ``rows`` sequences."""
        chosen, self._chosen = [self._chosen[i] for i in range(len(self.routers))], {}
        return torch.stack(chosen, dim=1).to(torch.int16).view(rows, -1, len(chosen), chosen[0].shape[-1])


class RouteGrid:
    """One generated micro-batch's routes by position: ``prompt`` the prompt forward's (rows, P, layers, top_k),
    then ``step`` places each decoding forward's, one token per live row; ``result`` is the (rows, P + max_new,
    layers, top_k) grid, -1 where no forward routed a token (left padding the rollout dropped is added back)."""

    def __init__(self, prompt: torch.Tensor, max_new: int) -> None:
        b, self.prompt_len = prompt.shape[:2]
        self.grid = prompt.new_full((b, self.prompt_len + max_new, *prompt.shape[2:]), -1)
        self.grid[:, : self.prompt_len] = prompt

    def step(self, rows: torch.Tensor, t: int, chosen: torch.Tensor) -> None:
        """``chosen`` (live rows, 1, layers, top_k): the routes of response token ``t`` of ``rows``."""
        self.grid[rows, self.prompt_len + t] = chosen[:, 0]

    def result(self, dropped: int) -> torch.Tensor:
        return torch.cat([self.grid.new_full((len(self.grid), dropped, *self.grid.shape[2:]), -1), self.grid], 1)


def layout_routes(routes: torch.Tensor, source: torch.Tensor | None) -> torch.Tensor:
    """A micro-batch's ``routes`` (rows, T, layers, top_k) in a forward's token order: the padded forward's (rows x
    T, ``source`` None), or a packed layout's (``source``: the flat padded index of each packed token, -1 for a
    pad), whose pads get no record."""
    flat = routes.reshape(-1, *routes.shape[2:])
    if source is None:
        return flat
    return torch.where((source >= 0)[:, None, None], flat[source.clamp(min=0)], -1)


@contextmanager
def replaying(model: torch.nn.Module, routes: torch.Tensor | None) -> Iterator[None]:
    """Every router of ``model`` routes the forward's tokens to ``routes`` (tokens, layers, top_k) where recorded
    (>= 0); nothing changes with ``routes`` None or a dense model."""
    found = routers(model) if routes is not None else []
    if routes is None or not found:
        yield
        return
    given = routes
    if given.shape[1] != len(found):
        raise ValueError(
            f"routing replay: the rollout recorded {given.shape[1]} MoE layers, the model has {len(found)}"
        )

    def hook(layer: int) -> Any:
        def replace(module: torch.nn.Module, _args: Any, out: Any) -> Any:
            logits, _, own = out[0], out[1], out[-1]
            recorded = given[:, layer].to(own.device, torch.long)
            if recorded.shape != own.shape:
                raise ValueError(
                    f"routing replay: MoE layer {layer} routed {tuple(own.shape)} tokens x experts, the recorded "
                    f"routes are {tuple(recorded.shape)}"
                )
            experts = torch.where(recorded[:, :1] >= 0, recorded, own)
            return (logits, expert_weights(module, logits, experts).to(out[1].dtype), experts)

        return replace

    with hooked(found, hook):
        yield
