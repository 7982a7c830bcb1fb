"""What goes into ``vllm``'s requests and what its outputs become: per-sample seeds as each request's own, the
responses and their log-probs, and for a truncated draw (sampling-mask replay) each position's kept set and mass,
from vLLM's top log-probs.

vLLM's own record of the kept sets (``return_sampling_mask``) needs its Model Runner V2, which needs Triton: not
on CPU. The set of a truncated draw is a prefix of the distribution sorted by probability (top-k, then the nucleus
of the renormalised top-k), so the engine is asked for as many top log-probs as sampling may keep (``top_k``, or
``rollout.replay_max_kept``) and the set is recomputed from them, with the rule ``hf`` samples by
(``armor_core.ops.sampling_replay.truncate``). Those log-probs are the untruncated ones at the sampling temperature
(``raw_logprobs`` with the temperature folded into the logit scale: ``vllm.py``).
"""

from __future__ import annotations

from typing import Any

import torch

from armor_core.ops.sample_seeds import SEED_KEY
from armor_core.ops.sampling_replay import KEPT_IDS, KEPT_MASS, kept_set, truncate

__all__ = ["kept_from_top", "kept_tensors", "responses_of", "seeded", "truncation"]


def kept_from_top(
    top_ids: torch.Tensor, top_log_probs: torch.Tensor, sampled: torch.Tensor, top_k: int, top_p: float, keep: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One response's kept sets and truncated log-probs from the engine's top log-probs of each position.

    The kept set of a truncated draw is a prefix of the distribution sorted by probability (top-k, then the
    nucleus of the renormalised top-k), so the K most likely tokens hold it whenever K >= top_k.

    :param top_ids: (L, K) the K most likely token ids of each position (any order; -1 where fewer).
    :param top_log_probs: (L, K) their untruncated log-probs (at the sampling temperature; -inf where -1).
    :param sampled: (L,) the sampled ids.
    :returns: ``(ids (L, K') int32 -1 padded (K' 0 unless ``keep``), log_mass (L,), kept (L,) bool: the sampled
        token is in its set)``; a sampled token outside the set (a tie at its edge, rounded otherwise) is added to it.
    """
    truncated = truncate(top_log_probs.float(), top_k, top_p)
    is_sampled = top_ids == sampled[:, None]
    truncated = torch.where(is_sampled, top_log_probs.float(), truncated)  # the draw itself is always in its set
    log_mass = torch.logsumexp(truncated, dim=-1)
    if not keep:
        return torch.empty((len(top_ids), 0), dtype=torch.int32), log_mass, is_sampled.any(-1)
    columns, _ = kept_set(truncated, top_log_probs.float())  # the kept columns of the top list, -1 padded
    ids = torch.where(columns >= 0, top_ids.gather(-1, columns.long().clamp(min=0)), -1).to(torch.int32)
    return ids, log_mass, is_sampled.any(-1)


def kept_tensors(
    outputs: Any, responses: torch.Tensor, mask: torch.Tensor, top_k: int, top_p: float, keep: bool
) -> dict[str, torch.Tensor]:
    """The kept sets (with ``keep``) and masses of a truncated draw, from each position's top log-probs."""
    b, max_new = responses.shape
    mass = torch.ones((b, max_new), dtype=torch.float32)
    sets: list[torch.Tensor] = []
    for i, out in enumerate(outputs):
        steps = list(out.outputs[0].logprobs)[: int(mask[i].sum())]
        if not steps:
            sets.append(torch.empty((0, 0), dtype=torch.int32))
            continue
        width = max(len(step) for step in steps)
        ids = torch.full((len(steps), width), -1, dtype=torch.long)
        lps = torch.full((len(steps), width), float("-inf"))
        for t, step in enumerate(steps):
            ids[t, : len(step)] = torch.tensor(list(step.keys()))
            lps[t, : len(step)] = torch.tensor([v.logprob for v in step.values()])
        kept, log_mass, _ = kept_from_top(ids, lps, responses[i, : len(steps)], top_k, top_p, keep)
        mass[i, : len(steps)] = log_mass.exp()
        sets.append(kept)
    out = {KEPT_MASS: mass}
    if keep:
        width = max([s.shape[-1] for s in sets] + [1])
        ids = torch.full((b, max_new, width), -1, dtype=torch.int32)
        for i, s in enumerate(sets):
            ids[i, : s.shape[0], : s.shape[1]] = s
        out[KEPT_IDS] = ids
    return out


def responses_of(outputs: Any, max_new: int, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's outputs as ``(responses, response_mask, rollout_log_probs)``, each (bs, max_new), right-padded; the
    log-probs untruncated (``_kept`` renormalises those of a truncated draw)."""
    b = len(outputs)
    responses = torch.full((b, max_new), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros((b, max_new), dtype=torch.long)
    log_probs = torch.zeros((b, max_new), dtype=torch.float32)
    for i, out in enumerate(outputs):
        completion = out.outputs[0]
        tokens = list(completion.token_ids)[:max_new]
        responses[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        response_mask[i, : len(tokens)] = 1
        log_probs[i, : len(tokens)] = torch.tensor(
            [step[tok].logprob for step, tok in zip(completion.logprobs, tokens)], dtype=torch.float32
        )
    return responses, response_mask, log_probs


def truncation(greedy: bool, top_k: int, top_p: float, bound: int, vocab: int) -> tuple[bool, int]:
    """Whether a draw truncates, and the top-k to sample with (and as many top log-probs to ask for): a truncated
    draw's kept set is read off each position's top log-probs, so it keeps at most as many tokens as come back
    (``rollout.replay_max_kept`` unless top_k is set; never more than the vocabulary, which vLLM refuses)."""
    truncating = not greedy and (top_p < 1.0 or top_k > 0)
    if truncating:
        top_k = top_k if top_k > 0 else bound
        top_k = min(top_k, vocab) if vocab else top_k
    return truncating, top_k


def seeded(params: Any, prompts: Any) -> Any:
    """``params`` for every request, or, when the rows carry per-sample seeds (``armor_core.ops.sample_seeds``), one
    copy per row with the row's seed: vLLM then samples each request from a generator of its own, so a row's tokens do
    not depend on the batch around it."""
    if SEED_KEY not in prompts.tensors:
        return params
    out = []
    for seed in prompts.tensors[SEED_KEY].tolist():
        p = params.clone()
        p.seed = seed & (2**63 - 1)
        out.append(p)
    return out
