"""ReMax's greedy baseline in the step: one greedy generation per prompt, of the prompt's own tokens,
padded to the generating ranks, scored like the samples, and each row given its own prompt's score."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from armor_core.dataproto.protocol import DataProto
from armor_core.loop.baseline import GreedyBaseline


class _Rollout:
    """Generates, for each prompt, one response token: the prompt's last id + 100."""

    ranks = 2

    def __init__(self):
        self.calls = []

    def generate(self, prompts, version, greedy):
        self.calls.append((prompts, version, greedy))
        ids = prompts["input_ids"]
        responses = ids[:, -1:] + 100
        ones = torch.ones_like(responses)
        return DataProto.from_dict(
            tensors={
                "prompts": ids,
                "responses": responses,
                "response_mask": ones,
                "input_ids": torch.cat([ids, responses], 1),
                "attention_mask": torch.cat([prompts["attention_mask"], ones], 1),
                "position_ids": torch.cat([prompts["position_ids"], prompts["position_ids"][:, -1:] + 1], 1),
            },
            non_tensors={"reward_text": np.array([f"greedy {i}" for i in ids[:, -1].tolist()], dtype=object)},
        )


class _Scorer:
    """Scores a row by its response token; records what it was given."""

    def score(self, full):
        self.full = full
        scores = full["responses"][:, 0].float()
        return scores, {}, [str(int(s)) for s in scores]


def _step_batch():
    # 3 prompts x 2 samples, prompts left-padded to 3 tokens; uids not in order; responses of 2 tokens
    prompt_ids = torch.tensor([[0, 11, 12], [0, 11, 12], [21, 22, 23], [21, 22, 23], [0, 0, 31], [0, 0, 31]])
    prompt_mask = (prompt_ids != 0).long()
    responses = torch.tensor([[1, 2], [3, 4], [5, 6], [7, 8], [9, 1], [2, 3]])
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": responses,
            "response_mask": torch.ones_like(responses),
            "input_ids": torch.cat([prompt_ids, responses], 1),
            "attention_mask": torch.cat([prompt_mask, torch.ones_like(responses)], 1),
            "position_ids": torch.cat(
                [prompt_mask.cumsum(1) - 1, prompt_mask.sum(1, keepdim=True) + 0 + torch.arange(2)], 1
            ),
        },
        non_tensors={
            "uid": np.array([7, 7, 3, 3, 5, 5]),
            "data_source": np.array(["a", "a", "b", "b", "c", "c"], dtype=object),
            "reward_text": np.array(["sampled"] * 6, dtype=object),  # a multi-turn sample's; the greedy one replaces it
        },
    )


def test_one_greedy_response_per_prompt_scored_and_given_to_each_row_of_its_group():
    rollout, scorer = _Rollout(), _Scorer()
    scores, metrics = GreedyBaseline(rollout, scorer, multi_turn=True)(_step_batch(), step=5)
    ((prompts, version, greedy),) = rollout.calls
    assert greedy is True and version == 4  # the policy that sampled step 5
    # the prompts in uid order (3, 5, 7) with their own tokens only, padded to 2 ranks by repeating the first
    assert prompts["input_ids"].tolist() == [[21, 22, 23], [0, 0, 31], [0, 11, 12], [21, 22, 23]]
    assert prompts["attention_mask"].tolist()[:3] == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
    assert "responses" not in prompts and list(prompts.non_tensors["data_source"]) == ["b", "c", "a", "b"]
    assert list(scorer.full.non_tensors["reward_text"]) == ["greedy 23", "greedy 31", "greedy 12"]
    assert scores.tolist() == [112, 112, 123, 123, 131, 131]  # each row its own prompt's greedy score
    assert metrics["critic/baseline_score/mean"] == pytest.approx((112 + 123 + 131) / 3)


def test_a_batch_without_prompt_ids_is_refused_by_name():
    batch = _step_batch()
    batch.pop(tensor_keys=["prompts"])
    with pytest.raises(KeyError, match="'prompts'"):
        GreedyBaseline(_Rollout(), _Scorer(), multi_turn=False)(batch, step=1)
