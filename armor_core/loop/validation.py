"""Held-out validation: greedy accuracy per ``data_source`` and, with ``trainer.val_n = n > 1``,
``n`` samples per prompt scored as verl reports them.

For each data source, over its prompts:

- ``val/<source>/acc_greedy``: the greedy response is correct (its main domain scored 1);
- ``val/<source>/mean@n``: the share of the ``n`` samples that are correct (pass@1 estimated from n);
- ``val/<source>/best@n``: at least one of the ``n`` samples is correct (pass@n);
- ``val/<source>/maj@n``: the answer given most often among the ``n`` samples is correct (majority
  vote, self-consistency). The vote is on the response text with whitespace collapsed (a tie goes
  to the answer seen first): exact for short-answer tasks; where responses carry reasoning before
  the answer, ``maj@n`` counts identical responses only.

``val/acc_greedy`` and ``val/mean@n`` etc. without a source are over all prompts. Rows are scored as in
training (``step.Scorer``): ``score_*`` includes a multi-turn environment's reward parts, which are
components of weight 1 (``env:<name>``) and so the main one where the row's domains weigh less.
``armor eval`` scores through the same ``generate_and_score``.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt
    import torch

    from armor_core.dataproto.protocol import DataProto
    from armor_core.loop.step import Scorer

__all__ = ["accuracy_by_source", "at_n_metrics", "generate_and_score", "main_scores", "run_validation", "vote_key"]


def main_scores(components: Iterable[Mapping[str, tuple[float, float]]]) -> np.ndarray:
    """(B,) each row's score from its main domain: the one with the largest weight in its route (the
    first on a tie), i.e. the correctness check that components such as ``format`` and ``length``
    are added to. ``components``: per row ``{domain: (score, weight)}``, as in ``RewardBatch.components``."""
    return np.array(
        [max(c.values(), key=lambda score_weight: score_weight[1])[0] for c in components], dtype=np.float64
    )


def accuracy_by_source(
    scores: npt.ArrayLike, sources: npt.ArrayLike, mode: str, prefix: str = "", main: npt.ArrayLike | None = None
) -> dict[str, float]:
    """``{prefix}{source}/acc_{mode}``, ``{prefix}{source}/score_{mode}`` and ``{prefix}acc_{mode}``.

    A row is correct when its main domain scored 1 (to float tolerance: the reward domains'
    exact-match scale); ``main`` holds those scores (``main_scores``), and without it the row's
    score is used. ``score_{mode}`` is the mean weighted score.
    """
    scores = np.asarray(scores, dtype=np.float64)
    correct = np.asarray(scores if main is None else main, dtype=np.float64) >= 1.0 - 1e-6
    sources = np.asarray(sources)
    out: dict[str, float] = {}
    for src in sorted(set(sources.tolist())):
        sel = sources == src
        out[f"{prefix}{src}/acc_{mode}"] = float(correct[sel].mean())
        out[f"{prefix}{src}/score_{mode}"] = float(scores[sel].mean())
    out[f"{prefix}acc_{mode}"] = float(correct.mean()) if len(scores) else 0.0
    return out


def vote_key(response: str) -> str:
    """What a majority vote compares: the response with whitespace collapsed."""
    return " ".join(response.split())


def at_n_metrics(
    correct: np.ndarray, responses: Sequence[str], sources: Sequence[str] | np.ndarray, n: int, prefix: str = "val/"
) -> dict[str, float]:
    """``mean@n``, ``best@n`` and ``maj@n`` per source and overall. ``correct`` and ``responses``
    hold ``n`` consecutive samples per prompt; ``sources`` one entry per prompt."""
    correct = np.asarray(correct, dtype=bool).reshape(-1, n)
    if correct.shape[0] != len(sources) or len(responses) != correct.size:
        raise ValueError(
            f"at_n_metrics: {correct.size} scores and {len(responses)} responses for {len(sources)} prompts x n={n}"
        )
    majority = np.zeros(correct.shape[0], dtype=bool)
    for p in range(correct.shape[0]):
        keys = [vote_key(r) for r in responses[p * n : (p + 1) * n]]
        top = Counter(keys).most_common(1)[0][0]  # Counter keeps first-seen order among equal counts
        majority[p] = correct[p, keys.index(top)]
    sources = np.asarray(sources)
    out: dict[str, float] = {}
    for label, sel in [(f"{s}/", sources == s) for s in sorted(set(sources.tolist()))] + [
        ("", np.ones(len(sources), dtype=bool))
    ]:
        if sel.any():
            out[f"{prefix}{label}mean@{n}"] = float(correct[sel].mean())
            out[f"{prefix}{label}best@{n}"] = float(correct[sel].any(axis=1).mean())
            out[f"{prefix}{label}maj@{n}"] = float(majority[sel].mean())
    return out


def run_validation(
    data: DataProto,
    generate: Callable[[DataProto, bool], DataProto],
    scorer: Scorer,
    ranks: int,
    val_n: int,
    sampled: bool,
    multi_turn: bool = False,
) -> dict[str, float]:
    """Validation metrics of ``data`` (the encoded held-out prompts, a DataProto).

    :param generate: ``generate(prompts, greedy) -> rows`` (the trainer's rollout, any worker layout).
    :param scorer: ``step.Scorer``: scores generated rows and returns their decoded responses.
    :param ranks: the batch is padded to a multiple of this (every rank gets rows).
    :param multi_turn: the rows' columns go with the prompts (each episode's environment is built from its
        row) and the rollout's own columns (``reward_text``, ``env_reward_parts``) come back with it.
    """
    out: dict[str, float] = {}
    runs = (
        [("greedy", True, 1)]
        + ([("sampled", False, 1)] if sampled else [])
        + ([(f"@{val_n}", False, val_n)] if val_n > 1 else [])
    )
    for mode, greedy, n in runs:
        rows = data.repeat(n, interleave=True) if n > 1 else data
        full, scores, texts = generate_and_score(rows, generate, greedy, scorer, ranks, multi_turn)
        main = main_scores(full.non_tensors["reward_components"])  # correctness, without format or length components
        if n == 1:
            out.update(
                accuracy_by_source(scores.numpy(), full.non_tensors["data_source"], mode, prefix="val/", main=main)
            )
        else:
            out.update(at_n_metrics(main >= 1.0 - 1e-6, texts, data.non_tensors["data_source"], n))
    return out


def generate_and_score(
    rows: DataProto,
    generate: Callable[[DataProto, bool], DataProto],
    greedy: bool,
    scorer: Scorer,
    ranks: int,
    multi_turn: bool,
) -> tuple[DataProto, torch.Tensor, list[str]]:
    """``rows`` (prompt tensors and the rows' columns) generated and scored: ``(rows with their responses,
    (B,) scores, decoded responses)``. The batch is padded to a multiple of ``ranks`` with copies of its
    first rows, which are dropped again. A column the rollout returns (a multi-turn ``reward_text``)
    replaces the row's column of that name."""
    from armor_core.dataproto.protocol import DataProto
    from armor_core.loop.async_rollout import generation_request

    pad = (-len(rows)) % ranks
    padded = DataProto.concat([rows, rows[:pad]]) if pad else rows
    gen = generate(generation_request(padded, multi_turn), greedy)[: len(rows)]
    kept = [k for k in rows.non_tensors if k not in gen.non_tensors]
    full = rows.select(non_tensor_keys=kept).union(
        gen.select(tensor_keys=list(gen.tensors), non_tensor_keys=list(gen.non_tensors))
    )
    scores, _, texts = scorer.score(full)
    return full, scores, texts
