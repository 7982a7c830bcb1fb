"""Group statistics for advantage estimators: outcome scores, group ids and per-group statistics, the
per-component normalisation (``normalize_components``) a grouped estimator offers, discounted
returns, and :func:`outcomes`, the start every grouped outcome estimator shares.

Conventions the built-in estimators follow (and a third-party one may rely on):

* A row's *outcome score* is the sum of its token-level rewards over valid tokens (the reward
  domain puts the score on the last response token; a KL penalty folded into the reward spreads
  over all of them).
* A row with no valid token is not a sample: it is left out of its group's statistics and its
  advantage is 0.
* A group whose rewards carry no signal (a singleton, or all rewards equal) gets advantage
  exactly 0: it contributes no gradient, instead of float-rounding noise divided by a tiny std.
* Group statistics are computed in float64: cheap on (bs,) vectors, and rewards of 1e6 keep
  their precision.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from armor_core.ops.masked import as_bool_mask

__all__ = [
    "GroupStats",
    "Outcomes",
    "broadcast_to_tokens",
    "discounted_returns",
    "group_ids",
    "group_stats",
    "normalize_reward_components",
    "outcome_scores",
    "outcomes",
]


def group_ids(index: Any, batch_size: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, int]:
    """Map group ids to ``0..G-1``.

    :param index: (bs,) group ids: a torch tensor, a numpy array (integers, or any sortable
        values such as verl's string uids) or a list.
    :returns: ``(gid, G)``: (bs,) int64 tensor on ``device``, and the number of groups.
    """
    if isinstance(index, torch.Tensor):
        idx = index.detach().reshape(-1)
        if idx.numel() != batch_size:
            raise ValueError(
                f"index has {idx.numel()} entries (shape {tuple(index.shape)}) but token_level_rewards has "
                f"{batch_size} rows; index must be (bs,) group ids"
            )
        _, inverse = torch.unique(idx, return_inverse=True)
        inverse = inverse.to(device=device, dtype=torch.int64)
    else:
        arr = np.asarray(index)
        if arr.ndim != 1 or arr.shape[0] != batch_size:
            raise ValueError(
                f"index has shape {arr.shape} but token_level_rewards has {batch_size} rows; "
                "index must be (bs,) group ids"
            )
        _, inv = np.unique(arr, return_inverse=True)
        inverse = torch.as_tensor(inv.reshape(-1), dtype=torch.int64, device=device)
    num_groups = int(inverse.max().item()) + 1 if batch_size else 0
    return inverse, num_groups


def outcome_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(bs, T) rewards -> (bs,) float64 sum over valid tokens (0 for a fully masked row)."""
    m = as_bool_mask(response_mask)
    r = torch.where(
        m, token_level_rewards.double(), torch.zeros((), dtype=torch.float64, device=token_level_rewards.device)
    )
    return r.sum(dim=-1)


@dataclass(frozen=True)
class GroupStats:
    """Per-row views of its group's statistics, all (bs,), over the group's valid rows only.

    ``mean``; ``std`` (unbiased, 0 for fewer than 2 rows); ``count`` (valid rows in the group);
    ``no_signal`` (True when the row is invalid, its group has fewer than 2 valid rows, or all
    of them have the same score); ``gid`` and ``num_groups`` as from :func:`group_ids`.
    """

    mean: torch.Tensor
    std: torch.Tensor
    count: torch.Tensor
    no_signal: torch.Tensor
    gid: torch.Tensor
    num_groups: int


def group_stats(
    scores: torch.Tensor, index: Any, valid: torch.Tensor, weights: torch.Tensor | None = None
) -> GroupStats:
    """Statistics of ``scores`` within each group of ``index``, counting only ``valid`` rows.

    :param scores: (bs,) float64; :param valid: (bs,) bool, rows with at least one valid token.
    :param weights: optional (bs,) non-negative weights for the mean (OPO's length weighting);
        the std is always unweighted.
    """
    bs = scores.shape[0]
    gid, num_groups = group_ids(index, bs, scores.device)
    v = valid.to(torch.float64)
    zeros = torch.zeros(num_groups, dtype=torch.float64, device=scores.device)
    count = zeros.index_add(0, gid, v)
    w = v if weights is None else v * weights.to(torch.float64)
    wsum = zeros.index_add(0, gid, w)
    mean_g = zeros.index_add(0, gid, w * scores) / wsum.clamp(min=torch.finfo(torch.float64).tiny)
    unweighted_mean_g = zeros.index_add(0, gid, v * scores) / count.clamp(min=1)
    dev = torch.where(
        valid, scores - unweighted_mean_g[gid], torch.zeros((), dtype=torch.float64, device=scores.device)
    )
    var_g = zeros.index_add(0, gid, dev * dev) / (count - 1).clamp(min=1)
    inf = torch.tensor(float("inf"), dtype=torch.float64, device=scores.device)
    gmax = torch.full((num_groups,), -float("inf"), dtype=torch.float64, device=scores.device).scatter_reduce(
        0, gid, torch.where(valid, scores, -inf), "amax"
    )
    gmin = torch.full((num_groups,), float("inf"), dtype=torch.float64, device=scores.device).scatter_reduce(
        0, gid, torch.where(valid, scores, inf), "amin"
    )
    no_signal_g = (count < 2) | (gmax == gmin)
    return GroupStats(
        mean=mean_g[gid],
        std=torch.where(count >= 2, var_g.sqrt(), torch.zeros_like(var_g))[gid],
        count=count[gid],
        no_signal=no_signal_g[gid] | ~valid,
        gid=gid,
        num_groups=num_groups,
    )


def broadcast_to_tokens(row_values: torch.Tensor, response_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(bs,) per-row values -> (bs, T) at valid tokens, 0 elsewhere, in ``dtype``."""
    m = as_bool_mask(response_mask)
    return torch.where(m, row_values.unsqueeze(-1).to(dtype), torch.zeros((), dtype=dtype, device=row_values.device))


def discounted_returns(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """``G_t = r_t + gamma * G_next`` where ``next`` is the next *valid* token; 0 outside the mask.

    Masked positions inside a response (e.g. tool output in a multi-turn trace) are skipped: they
    are not time steps, so they neither discount nor reset the return. Rewards on masked
    positions are ignored.

    :param token_level_rewards: (bs, T); :param response_mask: (bs, T); :returns: (bs, T) float32+.
    """
    m = as_bool_mask(response_mask)
    r = (
        token_level_rewards.float()
        if token_level_rewards.dtype in (torch.float16, torch.bfloat16)
        else token_level_rewards
    )
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    r = torch.where(m, r, zero)
    returns = torch.zeros_like(r)
    running = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)
    for t in reversed(range(r.shape[1])):
        candidate = r[:, t] + gamma * running
        running = torch.where(m[:, t], candidate, running)
        returns[:, t] = torch.where(m[:, t], candidate, zero)
    return returns


def normalize_reward_components(
    scores: torch.Tensor, index: Any, valid: torch.Tensor, reward_components: Any, epsilon: float = 1e-6
) -> torch.Tensor:
    """Each reward component standardised within its group before the weighted sum (GDPO:
    "Group reward-Decoupled normalization Policy Optimization", Liu et al.).

    Summing first lets each component's raw spread within the group, not its weight, decide how
    much it moves the advantages, and distinct combinations of components that sum alike get
    the same advantage. Standardised first, each component that varies in a group counts by its
    weight alone. Row ``i``'s score becomes ``scores_i - sum_k w_ik s_ik + sum_k w_ik z_ik`` with
    ``z_ik = (s_ik - mean_g s_k) / (std_g s_k + epsilon)`` over the valid rows of its group routed
    to domain k (unbiased std, as GRPO's), so whatever else the score holds (a KL penalty folded
    into the reward) is kept; the estimator then runs on these scores as usual. A row not routed to
    k takes no part in k's statistics and gains nothing from k; a component that is equal across
    its group (or has one row) gives 0.

    :param scores: (bs,) float64 outcome scores; :param index: (bs,) group ids;
    :param valid: (bs,) bool, rows with a valid token.
    :param reward_components: per row, ``{domain: (score, weight)}`` (the trainer's ``reward_components``).
    :returns: (bs,) float64.
    """
    if reward_components is None:
        raise ValueError(
            "normalize_components needs each row's reward components (reward_components, which the trainer passes "
            "from the scoring step); call the estimator with them or set normalize_components=false"
        )
    if len(reward_components) != scores.shape[0]:
        raise ValueError(
            f"reward_components has {len(reward_components)} rows but token_level_rewards has {scores.shape[0]}"
        )
    out = scores.clone()
    zero = torch.zeros((), dtype=torch.float64, device=scores.device)
    for name in sorted({d for row in reward_components for d in row}):
        routed = torch.tensor([name in row for row in reward_components], device=scores.device) & valid
        s, w = (
            torch.tensor(
                [float(row[name][j]) if name in row else 0.0 for row in reward_components],
                dtype=torch.float64,
                device=scores.device,
            )
            for j in (0, 1)
        )
        stats = group_stats(s, index, routed)
        z = torch.where(stats.no_signal, zero, (s - stats.mean) / (stats.std + epsilon))
        out = out + torch.where(routed, w * (z - s), zero)
    return out


@dataclass(frozen=True)
class Outcomes:
    """A batch seen as one outcome score per response: what a grouped estimator starts from.

    ``mask`` (bs, T) bool response mask; ``scores`` (bs,) float64 outcome scores (per-component
    normalised when asked); ``valid`` (bs,) bool, rows with at least one valid token; ``dtype`` the
    token-level rewards' dtype, which the advantages are returned in.
    """

    mask: torch.Tensor
    scores: torch.Tensor
    valid: torch.Tensor
    dtype: torch.dtype

    def to_tokens(self, row_advantages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(bs,) advantages -> ``(advantages, returns)``, both (bs, T) in ``dtype``, equal, 0 outside the mask."""
        out = broadcast_to_tokens(row_advantages, self.mask, self.dtype)
        return out, out.clone()


def outcomes(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    normalize_components: bool = False,
    reward_components: Sequence[Mapping[str, tuple[float, float]]] | None = None,
) -> Outcomes:
    """The outcome scores of a batch, each reward component standardised within its group first when
    ``normalize_components`` (:func:`normalize_reward_components`).

    :param token_level_rewards: (bs, T); a row's score is its sum over valid tokens.
    :param response_mask: (bs, T), any dtype, 1/True on response tokens.
    :param index: (bs,) group ids (tensor, numpy array or list).
    :param normalize_components: ``algorithm.adv_kwargs.normalize_components``.
    :param reward_components: per row ``{domain: (score, weight)}``, passed by the trainer.
    """
    m = as_bool_mask(response_mask)
    valid = m.any(dim=-1)
    scores = outcome_scores(token_level_rewards, m)
    if normalize_components:
        scores = normalize_reward_components(scores, index, valid, reward_components)
    return Outcomes(mask=m, scores=scores, valid=valid, dtype=token_level_rewards.dtype)
