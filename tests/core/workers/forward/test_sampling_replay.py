"""Sampling-mask replay: with top-p / top-k the trainer's log-probs are over the set the rollout sampled from.

The actor here runs in this process (no Ray): it samples with ``rollout.top_p`` < 1, and its own log-probs of
those tokens (what the update's ratio starts from) must be the ones the rollout drew them with, in every forward
layout, while without replay they fall short by exactly the kept mass."""

from __future__ import annotations

import pytest
import torch

from armor_core.config.schema import load_config, to_dict
from armor_core.dataproto.protocol import DataProto
from armor_core.ops.sampling_replay import KEPT_IDS, KEPT_MASS, replayed

BASE = [
    "data.train_size=64",
    "data.val_size=8",
    "data.train_batch_size=8",
    "actor.ppo_mini_batch_size=8",
    "rollout.n=4",
    "actor.micro_batch_size=16",
    "rollout.max_new_tokens=12",
]


def _sampled(tmp_path, overrides):
    from armor_core.loop.data import prepare_data
    from armor_core.workers.actor.worker import ActorWorker

    cfg = load_config(None, [*BASE, f"trainer.run_dir={tmp_path}", *overrides])
    train, _ = prepare_data(cfg)
    prompts = DataProto.from_dict(tensors=dict(train.encoded["tensors"]))[:8].repeat(4, interleave=True)
    worker = ActorWorker(to_dict(cfg))
    torch.manual_seed(0)
    return worker, worker.generate(prompts)


def _gap(worker, batch, layouts=None):
    if layouts is not None:
        worker.logp.layouts = layouts
    old = worker.compute_log_prob(batch)["old_log_probs"]
    mask = batch["response_mask"].bool()
    return (old - batch["rollout_log_probs"])[mask]


@pytest.mark.parametrize("sampling", ["rollout.top_p=0.8", "rollout.top_k=3"])
def test_the_trainer_scores_each_token_over_the_set_it_was_sampled_from_in_every_layout(tmp_path, sampling):
    worker, batch = _sampled(tmp_path, [sampling])
    mask = batch["response_mask"].bool()
    ids, mass = batch[KEPT_IDS], batch[KEPT_MASS]
    assert ids.dtype == torch.int32 and ids.shape[:2] == batch["responses"].shape
    assert (ids[~mask] == -1).all(), "no set recorded past a response's end"
    sizes = (ids >= 0).sum(-1)[mask]
    assert sizes.min() >= 1 and (sizes <= 3).all() if "top_k" in sampling else sizes.min() >= 1
    # the sampled token is always in its set, and the rollout's log-prob is over that set
    assert ((ids == batch["responses"][..., None]).any(-1) | ~mask).all()
    assert 0.2 < float(mass[mask].mean()) < 0.999 and (mass[~mask] == 1).all()
    for layouts in ((), ("packed",), ("grouped", "packed")):
        gap = _gap(worker, batch, layouts)
        assert gap.abs().max() < 2e-5, (layouts, gap.abs().max())
    worker.logp.chunk_tokens = 0  # the full logits instead of the chunked head
    assert _gap(worker, batch).abs().max() < 2e-5


def test_without_replay_the_gap_is_the_kept_mass_and_no_set_is_recorded(tmp_path):
    worker, batch = _sampled(tmp_path, ["rollout.top_p=0.8", "rollout.sampling_replay=false"])
    assert KEPT_IDS not in batch, "replay off records no sets"
    mask = batch["response_mask"].bool()
    # the trainer scores over the whole vocabulary, the rollout drew from the renormalised nucleus: off by log p(S)
    gap = _gap(worker, batch)
    assert torch.allclose(gap, batch[KEPT_MASS][mask].log(), atol=2e-5)
    assert float(gap.mean()) < -0.05


def test_untruncated_sampling_records_no_set_and_scores_as_before(tmp_path):
    worker, batch = _sampled(tmp_path, [])
    assert KEPT_IDS not in batch and KEPT_MASS not in batch
    assert _gap(worker, batch).abs().max() < 2e-5


def test_replayed_log_probs_and_their_gradient_equal_a_renormalised_softmax():
    torch.manual_seed(3)
    logits = torch.randn(2, 5, 11, requires_grad=True)
    tokens = torch.randint(0, 11, (2, 5))
    kept = torch.full((2, 5, 4), -1, dtype=torch.int32)
    for r in range(2):
        for t in range(4):  # the last position of each row has no set: scored over the whole vocabulary
            others = [i for i in torch.randperm(11).tolist() if i != int(tokens[r, t])][: t % 3]
            kept[r, t, : 1 + len(others)] = torch.tensor([int(tokens[r, t]), *others], dtype=torch.int32)
    logp = logits.log_softmax(-1)
    got = replayed(logp.gather(-1, tokens[..., None])[..., 0], logp.gather(-1, kept.long().clamp(min=0)), kept)
    one_hot = torch.nn.functional.one_hot(kept.long().clamp(min=0), 11).bool()
    in_set = (one_hot & (kept >= 0)[..., None]).any(-2)
    in_set[:, 4] = True
    want = logits.masked_fill(~in_set, float("-inf")).log_softmax(-1).gather(-1, tokens[..., None])[..., 0]
    assert torch.allclose(got, want, atol=1e-6)
    w = torch.randn(2, 5)
    (g_got,) = torch.autograd.grad((got * w).sum(), logits)
    (g_want,) = torch.autograd.grad((want * w).sum(), logits)
    assert torch.isfinite(g_got).all() and torch.allclose(g_got, g_want, atol=1e-6)


def test_a_top_k_above_the_recorded_bound_is_refused_naming_both_settings(tmp_path):
    with pytest.raises(ValueError, match=r"top_k=9 is larger than rollout.replay_max_kept=4"):
        _sampled(tmp_path, ["rollout.top_k=9", "rollout.replay_max_kept=4"])
