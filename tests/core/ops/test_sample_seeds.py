"""Per-sample seeds: a row's samples depend on (run seed, epoch, row, sample index) only, not on the batch around it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from armor_core.config.schema import RolloutConfig
from armor_core.dataproto.protocol import DataProto
from armor_core.loop.data import PromptLoader
from armor_core.models.loading import encode_prompts, load_model, load_tokenizer
from armor_core.ops.sample_seeds import SEED_KEY, mix, row_seeds, uniform
from armor_plugins.rollout.hf import HFRollout


@pytest.fixture(scope="module")
def policy():
    from armor_plugins.tasks.arithmetic import generate_arithmetic

    model, tok = load_model("builtin:arithmetic-tiny").eval(), load_tokenizer("builtin:arithmetic-tiny")
    rows = generate_arithmetic("test", 12, seed=0)
    ids, mask, pos, _ = encode_prompts(tok, [r["prompt"] for r in rows], 32)
    encoded = {
        "tensors": {"input_ids": ids, "attention_mask": mask, "position_ids": pos},
        "non_tensors": {"uid": np.arange(12, dtype=np.int64)},
    }
    return model, tok, encoded


def _generate(policy, batch, **cfg):
    model, tok, _ = policy
    torch.manual_seed(123)  # the global generator: seeded rows must not draw from it
    return HFRollout(model, tok, RolloutConfig(max_new_tokens=10, **cfg)).generate(batch)


def test_a_rows_samples_do_not_depend_on_the_micro_batch_size_or_the_rows_around_it(policy):
    loader = PromptLoader(policy[2], 6, shuffle=True, seed=7)
    batch = loader.next_samples(4)  # 6 prompts x 4 samples
    assert batch[SEED_KEY].dtype == torch.int64 and len(set(batch[SEED_KEY].tolist())) == 24
    whole = _generate(policy, batch)
    for micro in (1, 5, 32):
        assert torch.equal(_generate(policy, batch, micro_batch_size=micro)["responses"], whole["responses"]), micro
    # the rows in another order, half of them alone: each row's tokens are its own
    order = torch.randperm(24, generator=torch.Generator().manual_seed(0))
    shuffled = _generate(policy, batch[order.numpy()])
    assert torch.equal(shuffled["responses"], whole["responses"][order])
    alone = _generate(policy, batch[np.arange(12, 24)])
    assert torch.equal(alone["responses"], whole["responses"][12:])
    # the tokens are the same; their log-probs only to float rounding (a batch of another shape multiplies in
    # another order)
    assert torch.allclose(alone["rollout_log_probs"], whole["rollout_log_probs"][12:], atol=1e-5)
    # a row's four samples differ from each other (a seed of their own), and with top-p too
    groups = whole["responses"].view(6, 4, -1)
    assert all(len({tuple(r.tolist()) for r in g}) > 1 for g in groups)
    nucleus = [_generate(policy, batch, top_p=0.9, micro_batch_size=m)["responses"] for m in (3, 24)]
    assert torch.equal(*nucleus)


def test_a_rerun_repeats_and_another_seed_or_epoch_changes_the_samples(policy):
    def first(seed, skip=0):
        loader = PromptLoader(policy[2], 6, shuffle=False, seed=seed)
        for _ in range(skip):
            loader.next_samples(2)
        return loader.next_samples(2)

    a, b = first(7), first(7)
    assert torch.equal(a[SEED_KEY], b[SEED_KEY])
    assert torch.equal(_generate(policy, a)["responses"], _generate(policy, b)["responses"])
    assert not torch.equal(_generate(policy, first(8))["responses"], _generate(policy, a)["responses"])
    # the same rows in the next epoch (12 rows, 6 per batch: batch 2 starts epoch 1 with rows 0-5 again)
    again = first(7, skip=2)
    assert list(again.non_tensors["uid"]) == list(a.non_tensors["uid"])
    assert not set(again[SEED_KEY].tolist()) & set(a[SEED_KEY].tolist())


def test_the_generate_n_override_gives_each_copy_of_a_seeded_row_its_own_seed(policy):
    loader = PromptLoader(policy[2], 3, shuffle=False, seed=1)
    batch = loader.next_samples(1)
    out = _generate(policy, batch, n=1)
    model, tok, _ = policy
    roll = HFRollout(model, tok, RolloutConfig(max_new_tokens=10))
    many = roll.generate(batch, n=3)
    copies = many["responses"].view(3, 3, -1)
    assert not torch.equal(copies[:, 0], copies[:, 1]) and not torch.equal(copies[:, 1], copies[:, 2])
    assert torch.equal(roll.generate(batch, n=3)["responses"], many["responses"])  # seeded: the same again
    assert out["responses"].shape == (3, 10)


def test_the_draws_are_uniform_and_the_mix_is_a_function_of_every_part():
    seeds = row_seeds(0, 0, np.arange(4000), 5)
    assert len(set(seeds.tolist())) == 20000
    u = uniform(seeds, 3)
    assert u.dtype == torch.float64 and 0 <= float(u.min()) and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.003
    assert torch.equal(mix(5, 1, 2), mix(5, 1, 2)) and not torch.equal(mix(5, 1, 2), mix(5, 2, 1))
    hist = torch.histc(u.float(), bins=10, min=0, max=1) / len(u)
    assert (hist - 0.1).abs().max() < 0.01


def test_inverse_cdf_sampling_follows_the_distribution_and_never_draws_a_zero_probability_token():
    from armor_plugins.rollout.hf import sample_next_token

    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0]])).repeat(20000, 1)
    draws = uniform(torch.arange(20000), 0)
    tokens, lp, _ = sample_next_token(logits, greedy=False, temperature=1.0, uniforms=draws)
    freq = torch.bincount(tokens, minlength=4).float() / 20000
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2, 0.0]), atol=0.015) and freq[3] == 0
    edge = sample_next_token(logits[:2], greedy=False, temperature=1.0, uniforms=torch.tensor([0.0, 1 - 2**-53]))[0]
    assert edge.tolist() == [0, 2]
    tokens, _, _ = sample_next_token(logits, greedy=False, temperature=1.0, top_k=1, uniforms=draws)
    assert (tokens == 0).all()


def test_rows_without_seeds_keep_drawing_from_the_global_generator(policy):
    batch = DataProto.from_dict(tensors=dict(policy[2]["tensors"]))[:4]
    a, b = _generate(policy, batch), _generate(policy, batch)
    assert torch.equal(a["responses"], b["responses"])  # torch.manual_seed(123) before each
    assert SEED_KEY not in a
