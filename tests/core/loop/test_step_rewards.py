"""The step puts each row's score on its last trained token, also when the mask has gaps (multi-turn), and
measures the prompt's length without the observations appended to the response."""

import torch

from armor_core.dataproto.protocol import DataProto
from armor_core.loop.step import _on_last_token, batch_metrics


def test_the_score_goes_on_the_last_trained_token_past_an_observation_gap():
    # row 0: a turn, an observation (mask 0), the answer, then padding; row 1: one turn; row 2: nothing sampled
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]])
    out = _on_last_token(torch.tensor([1.0, 0.5, 2.0]), mask)
    assert out[0].tolist() == [0, 0, 0, 0, 0, 1.0, 0] and out[1].tolist() == [0, 0, 0.5, 0, 0, 0, 0]
    assert out[2].abs().sum() == 0
    # the estimators read a row's score as its sum over masked tokens: nothing is lost on an observation
    assert torch.equal((out * mask).sum(-1), torch.tensor([1.0, 0.5, 0.0]))


def test_prompt_length_counts_the_prompt_not_the_observations():
    # prompts of 2 and 3 tokens (left-padded to 3); responses: 2 sampled, 3 observation, 1 sampled; 1 sampled
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    present = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]])
    mask = torch.tensor([[1, 1, 0, 0, 0, 1], [1, 0, 0, 0, 0, 0]])
    batch = DataProto.from_dict(
        tensors={
            "input_ids": torch.zeros(2, 9, dtype=torch.long),
            "attention_mask": torch.cat([prompt_mask, present], dim=1),
            "responses": torch.zeros(2, 6, dtype=torch.long),
            "response_mask": mask,
            "token_level_rewards": torch.zeros(2, 6),
        }
    )
    metrics = batch_metrics(batch, torch.tensor([1.0, 0.0]))
    assert metrics["prompt_length/mean"] == 2.5 and metrics["response_length/mean"] == 2.0
