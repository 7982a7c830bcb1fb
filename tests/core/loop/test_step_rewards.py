"""The step puts each row's score on its last trained token, also when the mask has gaps (multi-turn)."""

import torch

from armor_core.loop.step import _on_last_token


def test_the_score_goes_on_the_last_trained_token_past_an_observation_gap():
    # row 0: a turn, an observation (mask 0), the answer, then padding; row 1: one turn; row 2: nothing sampled
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]])
    out = _on_last_token(torch.tensor([1.0, 0.5, 2.0]), mask)
    assert out[0].tolist() == [0, 0, 0, 0, 0, 1.0, 0] and out[1].tolist() == [0, 0, 0.5, 0, 0, 0, 0]
    assert out[2].abs().sum() == 0
    # the estimators read a row's score as its sum over masked tokens: nothing is lost on an observation
    assert torch.equal((out * mask).sum(-1), torch.tensor([1.0, 0.5, 0.0]))
