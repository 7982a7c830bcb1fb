"""Rollout correction (``algorithm.rollout_correction``): importance weights between the rollout's
policy and the trained one on the per-token policy loss.

Hand-computed weights for every mode; finite, bounded weights for any input; a two-action bandit
trained from stale rollouts that reaches the regularised optimum with correction and misses it
without; and the actor applying the weights it is configured with.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from armor_core.workers.losses.rollout_correction import MODES, correction_weights, nothing_kept

LN = math.log


def _inputs():
    # token ratios 1, 2, 4, 1/2 | 3, 1, (padding: NaN), (padding: inf)
    log_ratio = torch.tensor(
        [[0.0, LN(2), LN(4), -LN(2)], [LN(3), 0.0, float("nan"), float("inf")]], dtype=torch.float64
    )
    rollout = torch.full((2, 4), -1.5, dtype=torch.float64)
    return rollout + log_ratio, rollout, torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])


@pytest.mark.parametrize(
    "mode, expected, capped",
    [
        ("tis_token", [[1.0, 2.0, 2.5, 0.5], [2.5, 1.0, 0, 0]], 2 / 6),
        ("mask_token", [[1.0, 2.0, 0.0, 0.5], [0.0, 1.0, 0, 0]], 2 / 6),
        # sequence ratios: 1 * 2 * 4 * 1/2 = 4 and 3 * 1 = 3, both above the cap
        ("tis_seq", [[2.5] * 4, [2.5, 2.5, 0, 0]], 1.0),
        ("mask_seq", [[0.0] * 4, [0.0, 0.0, 0, 0]], 1.0),
    ],
)
def test_weights_are_the_hand_computed_ones(mode, expected, capped):
    old, rollout, mask = _inputs()
    w, m = correction_weights(old, rollout, mask, mode, cap=2.5)
    assert w.dtype == torch.float32
    assert torch.allclose(w, torch.tensor(expected), atol=1e-6)
    assert float(m["rollout_correction/weight_mean"]) == pytest.approx(sum(map(sum, expected)) / 6, rel=1e-6)
    assert float(m["rollout_correction/capped_frac"]) == pytest.approx(capped)
    ratios = [1, 2, 4, 0.5, 3, 1]  # k3: r - 1 - log r, per valid token
    assert float(m["rollout_correction/mismatch_kl"]) == pytest.approx(sum(r - 1 - LN(r) for r in ratios) / 6, rel=1e-6)


def test_a_short_sequence_under_the_cap_keeps_its_ratio():
    old = torch.tensor([[LN(1.5), 0.0, 0.0]])
    w, _ = correction_weights(old, torch.zeros(1, 3), torch.tensor([[1, 1, 0]]), "mask_seq", cap=2.0)
    assert torch.allclose(w, torch.tensor([[1.5, 1.5, 0.0]]))


def test_extremes_and_bad_arguments():
    old = torch.zeros(1, 4)
    rollout = torch.tensor([[-1000.0, 1000.0, -float("inf"), float("nan")]])
    w, m = correction_weights(old, rollout, torch.ones(1, 4), "tis_token", cap=2.0)
    # log-ratio 1000 and inf are bounded at 20 -> capped at 2; -1000 -> exp(-20); NaN -> 0
    assert torch.allclose(w, torch.tensor([[2.0, math.exp(-20), 2.0, 0.0]]))
    assert all(math.isfinite(float(v)) for v in m.values())
    w, m = correction_weights(old, rollout, torch.zeros(1, 4), "tis_token", cap=2.0)
    assert torch.equal(w, torch.zeros(1, 4)) and all(float(v) == 0.0 for v in m.values())
    assert not correction_weights(torch.zeros(1, 4, requires_grad=True), old, torch.ones(1, 4), "tis_seq", 2.0)[
        0
    ].requires_grad
    with pytest.raises(ValueError, match="rollout_correction_cap"):
        correction_weights(old, old, torch.ones(1, 4), "tis_token", cap=0.0)
    with pytest.raises(ValueError, match="expected one of"):
        correction_weights(old, old, torch.ones(1, 4), "none", cap=2.0)
    with pytest.raises(ValueError, match="shapes"):
        correction_weights(old, old[:, :2], torch.ones(1, 4), "tis_token", cap=2.0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=8, max_size=8),
    st.floats(min_value=0.01, max_value=100.0),
    st.sampled_from(MODES[1:]),
)
def test_weights_are_finite_and_bounded(values, cap, mode):
    x = torch.tensor(values).reshape(2, 4)
    w, m = correction_weights(x, x.flip(1), torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]]), mode, cap)
    assert torch.isfinite(w).all() and (w >= 0).all() and (w <= cap * (1 + 1e-6)).all()
    assert all(math.isfinite(float(v)) for v in m.values())


# -- a bandit trained from stale rollouts ----------------------------------------------------------

BETA = 0.5  # entropy bonus: the best policy is softmax(reward / BETA), an interior optimum
OPTIMUM = 1 / (1 + math.exp(-1 / BETA))  # P(action 0) with rewards (1, 0): 0.881


def _train_bandit(correction: str, cap: float = 5.0, steps: int = 400) -> float:
    """P(action 0) after training a 2-action softmax policy with the registered PPO loss on 4,096
    actions sampled once from a stale policy (P(action 0) = 0.3) and never refreshed."""
    from armor_core.plugins import PluginManager

    loss_fn = PluginManager().get("policy_loss", "ppo_clip").fn
    stale = torch.log(torch.tensor([0.3, 0.7]))
    actions = torch.multinomial(
        stale.exp(), 4096, replacement=True, generator=torch.Generator().manual_seed(0)
    ).unsqueeze(1)
    reward = (actions == 0).float()
    adv = reward - reward.mean()  # a baseline, as a group's mean gives
    mask = torch.ones_like(adv)
    theta = torch.zeros(2, requires_grad=True)
    opt = torch.optim.SGD([theta], lr=1.0)
    for _ in range(steps):
        log_pi = torch.log_softmax(theta, 0)
        log_prob = log_pi[actions]
        old = log_prob.detach()  # one update per batch: the policy being trained is "old"
        loss_mat, _ = loss_fn(log_prob, old, adv, mask)
        if correction != "none":
            w, _ = correction_weights(old, stale[actions], mask, correction, cap)
            loss_mat = loss_mat * w
        entropy = -(log_pi.exp() * log_pi).sum()
        opt.zero_grad()
        (loss_mat.mean() - BETA * entropy).backward()
        opt.step()
    return float(torch.softmax(theta.detach(), 0)[0])


@pytest.mark.parametrize("correction", MODES[1:])
def test_stale_rollouts_reach_the_optimum_only_with_correction(correction):
    # the ratio at the optimum is 0.881 / 0.3 = 2.9 < cap 5, so every mode is unbiased there
    assert _train_bandit(correction) == pytest.approx(OPTIMUM, abs=0.02)


def test_without_correction_stale_rollouts_overshoot():
    # uncorrected, the gradient is weighted by the stale policy's probabilities: its push towards
    # action 0 (0.3 * 0.7) exceeds what the entropy bonus can hold back at any point
    assert _train_bandit("none") > OPTIMUM + 0.08


def test_a_cap_below_the_optimum_ratio_truncates_towards_the_stale_policy():
    p = _train_bandit("tis_token", cap=2.0)
    assert OPTIMUM - 0.2 < p < OPTIMUM - 0.02


# -- the actor applies them -----------------------------------------------------------------------


def _worker(correction: str):
    from armor_core.config.schema import load_config, to_dict
    from armor_core.workers.actor.worker import ActorWorker

    overrides = [
        "data.train_batch_size=4",
        "actor.ppo_mini_batch_size=4",
        "rollout.n=1",
        "rollout.max_new_tokens=3",
        "data.max_prompt_length=4",
        "actor.micro_batch_size=4",
        "actor.lr=1e-3",
        "engine.cpus_per_worker=1",
        "trainer.loggers=[]",
        "actor.skip_zero_advantage=false",
        f"algorithm.rollout_correction={correction}",
        "algorithm.rollout_correction_cap=2.0",
    ]
    return ActorWorker(to_dict(load_config(None, overrides)), rank=0, world_size=1)


def _batch():
    from armor_core.dataproto.protocol import DataProto

    g = torch.Generator().manual_seed(0)
    prompts, responses = torch.randint(4, 19, (4, 4), generator=g), torch.randint(4, 19, (4, 3), generator=g)
    mask = torch.ones(4, 3, dtype=torch.long)
    attn = torch.ones(4, 7, dtype=torch.long)
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.cat([prompts, responses], 1),
            "attention_mask": attn,
            "position_ids": attn.cumsum(-1) - 1,
            "responses": responses,
            "response_mask": mask,
            "advantages": torch.randn(4, 3, generator=g),
        }
    )


def test_the_actor_multiplies_the_policy_loss_by_the_weights():
    """Rollout log-probs log 4 above the actor's make every weight 1/4: the gradient is that of the
    uncorrected loss with advantages / 4 (compared as gradients: Adam's step hides a uniform scale)."""
    plain, corrected = _worker("none"), _worker("tis_token")
    batch = _batch()
    own = corrected.compute_log_prob(batch)["old_log_probs"]
    stale = batch.select(tensor_keys=list(batch.tensors))
    stale["rollout_log_probs"] = own + LN(4)
    scaled = batch.select(tensor_keys=list(batch.tensors))
    scaled["advantages"] = batch["advantages"] / 4
    scaled["rollout_log_probs"] = own
    metrics = corrected.update_actor(stale, step=1)
    plain.update_actor(scaled, step=1)
    assert metrics["rollout_correction/weight_mean"] == pytest.approx(0.25, rel=1e-4)
    assert metrics["rollout_correction/capped_frac"] == 0.0
    assert metrics["rollout_correction/mismatch_kl"] == pytest.approx(0.25 - 1 + LN(4), rel=1e-3)
    grads = [
        (a.grad, b.grad) for a, b in zip(corrected.model.parameters(), plain.model.parameters()) if a.grad is not None
    ]
    assert grads and all(torch.allclose(a, b, rtol=1e-4, atol=1e-9) for a, b in grads)


def test_a_step_whose_weights_are_all_zero_is_warned_about():
    old = torch.tensor([[-1.0, -2.0, -0.5]])
    mask = torch.ones_like(old)
    _, dropped = correction_weights(old, old - 0.1, mask, "mask_token", 1.0)  # every ratio e^0.1 > 1: all masked
    _, kept = correction_weights(old, old + 0.1, mask, "mask_token", 1.0)
    metrics = {k: float(v) for k, v in dropped.items()}
    assert nothing_kept(metrics, 7, "mask_token", 1.0).startswith(
        "warning: step 7: algorithm.rollout_correction=mask_token gave every token weight 0 (100% of them past "
        "algorithm.rollout_correction_cap=1.0)"
    )
    assert nothing_kept({k: float(v) for k, v in kept.items()}, 7, "mask_token", 1.0) is None
    assert nothing_kept({"actor/pg_loss": 0.0}, 7, "none", 2.0) is None  # no correction: nothing to say
