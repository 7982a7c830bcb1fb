"""ReMax's baseline: the score of the policy's greedy response to each prompt of a step, ``GreedyBaseline``.

An estimator registered with ``greedy_baseline=True`` (``remax``) receives ``baseline_scores`` (bs,).
The step's prompts are taken once per group (the first row of each ``uid``), rebuilt from the
batch (a rollout's ``prompts`` column holds the prompt ids; the first ``prompts.shape[1]`` columns
of ``attention_mask`` and ``position_ids`` are theirs), generated greedily and scored with the same
domains as the samples, then each row gets its prompt's score. Validation's ``generate_and_score``
does the generating and scoring, so a multi-turn rollout plays a greedy episode per prompt.

Which policy: the one that sampled the step in sync mode (the update comes later); in async mode the
rollout workers' newest weights (version ``step - 1``), which may be newer than a stale batch's. The
greedy responses are not trained on, and a ``rewards`` fault of the fault-injection harness does not
touch their scores (it tests what the samples' rewards do).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from armor_core.loop.validation import generate_and_score

if TYPE_CHECKING:
    from armor_core.dataproto.protocol import DataProto
    from armor_core.loop.rollout_source import RolloutSource
    from armor_core.loop.step import Scorer

__all__ = ["GreedyBaseline"]


class GreedyBaseline:
    """``baseline(batch, step) -> ((bs,) scores, metrics)``; the trainer builds one for a ``greedy_baseline``
    estimator."""

    def __init__(self, rollout: RolloutSource, scorer: Scorer, multi_turn: bool) -> None:
        self.rollout, self.scorer, self.multi_turn = rollout, scorer, multi_turn

    def __call__(self, batch: DataProto, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        from armor_core.dataproto.protocol import DataProto

        if "prompts" not in batch:
            raise KeyError("a greedy baseline needs the rollout's 'prompts' column (the prompt ids), which is missing")
        uid = np.asarray(batch.non_tensors["uid"])
        _, first, group_of_row = np.unique(uid, return_index=True, return_inverse=True)
        rows = batch[first]
        width = rows["prompts"].shape[1]
        prompts = DataProto.from_dict(
            tensors={
                "input_ids": rows["prompts"],
                "attention_mask": rows["attention_mask"][:, :width],
                "position_ids": rows["position_ids"][:, :width],
            },
            non_tensors=dict(rows.non_tensors),
        )
        generate = lambda p, greedy: self.rollout.generate(p, step - 1, greedy=greedy)  # noqa: E731
        _, scores, _ = generate_and_score(prompts, generate, True, self.scorer, self.rollout.ranks, self.multi_turn)
        per_row = scores[torch.as_tensor(group_of_row)]
        return per_row, {"critic/baseline_score/mean": scores.mean().item()}
