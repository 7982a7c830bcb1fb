"""The critic's values of response tokens, computed in the actor's layouts.

``ValueModel`` is a backbone (the policy's architecture without its LM head) and a scalar head,
zero-initialised so the first values are 0. ``V(s_t)`` of response token ``t`` is read from the
hidden state of the token before it, as the log-prob of token ``t`` is read from that position's
logits; so a ``packed`` or ``grouped`` layout (``layouts.py``), whose ``predict_index`` says where
each response token is predicted, serves the critic as it serves the actor: no padded positions are
computed and a prompt shared by a group is computed once. ``ResponseValues`` chooses the layout
per micro-batch, checks each kind once against the padded forward, and counts what it computed
(``critic/padding_waste``, ``critic/prompt_sharing``).
"""

from __future__ import annotations

from typing import Callable, ContextManager

import torch

from armor_core.dataproto.protocol import DataProto
from armor_core.workers.forward.layouts import LayoutStats
from armor_core.workers.forward.logprobs import LayoutChoice
from armor_core.workers.forward.packing import PackedRows

__all__ = ["ResponseValues", "ValueModel"]


class ValueModel(torch.nn.Module):
    def __init__(self, backbone: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.value_head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        response_length: int,
        packed: PackedRows | None = None,
    ) -> torch.Tensor:
        """(bs, R) values of the padded batch's response tokens; with ``packed``, computed in that
        layout (0 where a response position holds no token)."""
        if packed is None:
            out = self.backbone(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            )
            hidden = out.last_hidden_state[:, -response_length - 1 : -1, :]
            return self.value_head(hidden.float())[..., 0].clone()  # not a view: FSDP2 hooks its backward on the output
        out = self.backbone(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            attention_mask=packed.attention_mask,
            use_cache=False,
        )
        hidden = out.last_hidden_state.flatten(0, 1)[packed.predict_index.to(input_ids.device)]
        values = self.value_head(hidden.float())[:, 0]
        grid = torch.zeros(input_ids.shape[0] * response_length, dtype=values.dtype, device=values.device)
        return grid.index_copy(0, packed.response_index.to(values.device), values).view(-1, response_length)


class ResponseValues(LayoutChoice):
    """:param model: the ``ValueModel``, unwrapped (its backbone decides which layouts are offered,
        and it checks a layout: a forward of the bare module is no collective under DDP).
    :param autocast: ``autocast()`` context for the compute dtype.
    :param collective: FSDP2 over that many ranks (> 1): every forward is a collective, so the ranks check a
        layout together (``LayoutChoice``)."""

    def __init__(
        self,
        model: ValueModel,
        device: torch.device,
        compute_dtype: torch.dtype,
        autocast: Callable[[], ContextManager],
        rank: int = 0,
        collective: int = 1,
    ) -> None:
        super().__init__(model.backbone, model, compute_dtype, autocast, f"critic rank {rank}", "values", collective)
        self.device = device

    def forward(
        self, module: torch.nn.Module, data: DataProto, rows: torch.Tensor, response_length: int
    ) -> torch.Tensor:
        """V(s_t), (rows, R) float32, for ``rows`` of ``data`` through ``module`` (the model or its
        data-parallel wrapper); with gradient when grad is enabled."""
        ids, attn, pos = (data[k][rows].to(self.device) for k in ("input_ids", "attention_mask", "position_ids"))
        packed = self.choose(ids, attn, pos, response_length, lambda m, p: m(ids, attn, pos, response_length, p))
        with self.autocast():
            values = module(ids, attn, pos, response_length, packed).float()
        self.count(LayoutStats.of(packed, attn))
        return values
