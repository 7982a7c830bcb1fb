"""Rows that share a prompt, for ``packing.pack_groups``: finding the groups, and the attention mask
of a packed row of shared-prompt segments (the prompt once, then each row's response).

Pure tensor functions: ``layouts.py`` decides whether the grouped layout pays and where each
segment goes; here is only what follows from the rows' tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PromptGroups", "group_by_prompt", "segment_attention"]


@dataclass(frozen=True)
class PromptGroups:
    """Rows that share a prompt. Per row (bs,): ``group``, real ``prompt_len``, ``resp_offset``
    (where its response starts after the earlier rows' of its group). Per group (n_groups,):
    ``first_row`` (whose prompt copy is kept), ``prompt`` length, ``segment`` length (the prompt
    once plus every response)."""

    group: torch.Tensor
    n_groups: int
    prompt_len: torch.Tensor
    resp_offset: torch.Tensor
    first_row: torch.Tensor
    prompt: torch.Tensor
    segment: torch.Tensor


def group_by_prompt(input_ids: torch.Tensor, mask: torch.Tensor, start: int) -> PromptGroups | None:
    """The prompt groups of (bs, T) rows whose prompt is columns [0, start), masked by ``mask``;
    None when no two rows share a prompt. Rows with the same prompt tokens are one group (the caller
    checks that positions are 0, 1, 2, ..., so their positions are the same too)."""
    bs, device = mask.shape[0], mask.device
    prompt_key = torch.where(mask[:, :start], input_ids[:, :start], -1)
    _, group = torch.unique(prompt_key, dim=0, return_inverse=True)
    n_groups = int(group.max()) + 1
    if n_groups == bs:
        return None
    prompt_len = mask[:, :start].sum(-1)
    resp_len = mask[:, start:].sum(-1)
    first_row = torch.full((n_groups,), bs, dtype=torch.long, device=device).scatter_reduce(
        0, group, torch.arange(bs, device=device), "amin"
    )
    g_resp = torch.zeros(n_groups, dtype=torch.long, device=device).index_add_(0, group, resp_len)
    # each row's responses start after the earlier rows' of its group
    by_group = torch.sort(group, stable=True).indices
    before = torch.cumsum(resp_len[by_group], 0) - resp_len[by_group]
    group_base = torch.zeros(n_groups, dtype=torch.long, device=device).scatter_reduce(
        0, group[by_group], before, "amin", include_self=False
    )
    resp_offset = torch.empty(bs, dtype=torch.long, device=device)
    resp_offset[by_group] = before - group_base[group[by_group]]
    g_prompt = prompt_len[first_row]
    return PromptGroups(group, n_groups, prompt_len, resp_offset, first_row, g_prompt, g_prompt + g_resp)


def segment_attention(
    dest: torch.Tensor,
    segment_of: torch.Tensor,
    owner_of: torch.Tensor,
    packed_pos: torch.Tensor,
    k: int,
    width: int,
    first_free: int,
) -> torch.Tensor:
    """(k, width, width) boolean mask, True = attend, of the tokens placed at the flat positions
    ``dest`` of (k, width) rows with positions ``packed_pos``: a query sees a key of its own segment
    (``segment_of``) that is in the prompt (owner -1) or in its own response (same ``owner_of``),
    and not later. Pads get ids from ``first_free`` up, used by no segment or row, so each pad is a
    segment and an owner of its own and sees only itself (no all-masked row)."""
    unique = torch.arange(k * width, device=dest.device) + first_free
    segment, owner = unique.clone(), unique.clone()
    segment[dest] = segment_of
    owner[dest] = owner_of
    segment, owner, pos = segment.view(k, width), owner.view(k, width), packed_pos.view(k, width)
    return (
        (segment[:, :, None] == segment[:, None, :])
        & ((owner[:, None, :] == -1) | (owner[:, :, None] == owner[:, None, :]))
        & (pos[:, None, :] <= pos[:, :, None])
    )
