"""``policy_kl``: the policy's change over one optimizer step, as the actor worker measures it for a guard that needs it.

The k3 estimator is checked by hand; the worker's number is checked against the KL computed from the
model's full next-token distributions before and after the step (the estimator is unbiased only in
expectation, so the comparison is of size, on a step whose KL is large enough to tell), zero for a step
that changes nothing, absent when no guard needs it, and the same on two DDP ranks as on one.
"""

from __future__ import annotations

import math

import pytest
import torch

from armor_core.testing import rollout_batch, run_ranks
from armor_core.workers.actor.policy_shift import PolicyShiftProbe, k3_kl

ROWS, R = 4, 3


def test_k3_by_hand_masked_and_clamped():
    old = torch.log(torch.tensor([[0.25, 0.5, 0.1]]))
    new = torch.log(torch.tensor([[0.5, 0.5, 0.9]]))
    total, count = k3_kl(new, old, torch.tensor([[1.0, 1.0, 0.0]]))
    # r = 2: (2 - 1) - ln 2 = 0.306853; r = 1: 0; the third token is masked out
    assert count == 2.0 and total == pytest.approx(1 - math.log(2), rel=1e-6)
    total, _ = k3_kl(torch.tensor([[0.0]]), torch.tensor([[-1000.0]]), torch.ones(1, 1))
    assert math.isfinite(total) and total == pytest.approx(math.expm1(20.0) - 20.0, rel=1e-5)  # log-ratio clamped


def test_the_probe_keeps_the_first_offer_only_and_measures_once():
    probe = PolicyShiftProbe(rows=2)
    lp = torch.zeros(3, 2)
    probe.keep("mini-a", torch.tensor([5, 6, 7]), lp, torch.ones(3, 2), 1.0)
    probe.keep("mini-b", torch.tensor([1]), lp, torch.ones(1, 2), 1.0)
    seen = []

    def forward(mini, idx):
        seen.append((mini, idx.tolist()))
        return torch.full((len(idx), 2), math.log(2.0))

    out = probe.measure(forward, world_size=1)
    assert seen == [("mini-a", [5, 6])]  # the first offer, cut to `rows`
    assert out["policy_kl"] == pytest.approx(1 - math.log(2))
    assert probe.measure(forward, world_size=1) == {}  # nothing kept any more
    assert PolicyShiftProbe(rows=0).measure(forward, 1) == {}


def test_in_a_distillation_run_the_probe_also_measures_the_kl_to_the_teacher():
    probe = PolicyShiftProbe(rows=2)
    old = torch.log(torch.tensor([[0.5, 0.25], [0.5, 0.5], [0.9, 0.9]]))
    teacher = torch.log(torch.tensor([[0.25, 0.5], [0.5, 0.5], [0.1, 0.1]]))
    mini = {"teacher_log_prob": teacher}
    probe.keep(mini, torch.tensor([0, 1, 2]), old, torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0]]), 1.0)
    out = probe.measure(lambda m, idx: old[idx], world_size=1)  # a step that changed nothing
    # rows 0 and 1, three tokens: r = p_T / p_S = 0.5, 2, 1: (r - 1) - ln r = 0.193147, 0.306853, 0
    assert out["policy_kl"] == 0.0 and out["teacher_kl"] == pytest.approx(
        (0.5 - 1 - math.log(0.5) + 2 - 1 - math.log(2)) / 3
    )
    probe.keep("no-teacher", torch.tensor([0]), old, torch.ones(1, 2), 1.0)
    assert set(probe.measure(lambda m, idx: old[idx], world_size=1)) == {"policy_kl"}


def config(*extra: str, rows: int = ROWS, length: int = R) -> dict:
    from armor_core.config.schema import load_config, to_dict

    return to_dict(
        load_config(
            None,
            [
                f"data.train_batch_size={rows}",
                f"actor.ppo_mini_batch_size={rows}",
                "rollout.n=1",
                f"rollout.max_new_tokens={length}",
                "actor.skip_zero_advantage=false",
                "engine.cpus_per_worker=1",
                "trainer.loggers=[]",
                *extra,
            ],
        )
    )


def sampled_batch(worker, rows: int):
    """``rows`` random prompts and the worker's own samples for them (the old policy's tokens), random advantages."""
    from armor_core.dataproto.protocol import DataProto

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 15, (rows, 3), generator=g)
    ones = torch.ones_like(ids)
    batch = worker.generate(
        DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": ones, "position_ids": ones.cumsum(-1) - 1})
    )
    batch.tensors["advantages"] = torch.randn(batch["responses"].shape, generator=g) * batch["response_mask"]
    return batch


def exact_kl_per_token(before: torch.Tensor, after: torch.Tensor, mask: torch.Tensor) -> float:
    return float(((before.exp() * (before - after)).sum(-1) * mask).sum() / mask.sum())


def next_token_log_probs(model, batch, length: int) -> torch.Tensor:
    """(rows, length, vocab) log-softmax at each response position, from the full logits."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return torch.log_softmax(logits[:, -length - 1 : -1].float(), -1)


@pytest.mark.slow
def test_policy_kl_matches_the_exact_kl_and_is_zero_for_a_step_that_changes_nothing():
    from armor_core.workers.actor.policy_shift import PROBE_ROWS
    from armor_core.workers.actor.worker import ActorWorker

    rows, length = PROBE_ROWS, 6  # the probe is the whole batch: the exact KL is over the same rows
    need = "guard.guards=[{name: trust_region, params: {target_kl: 1.0e9}}]"
    w = ActorWorker(config(need, "actor.lr=3e-3", rows=rows, length=length))
    batch = sampled_batch(w, rows)
    before = next_token_log_probs(w.model, batch, length)
    m = w.update_actor(batch, step=1)
    exact = exact_kl_per_token(before, next_token_log_probs(w.model, batch, length), batch["response_mask"].float())
    assert exact > 1e-3, "the step must move the policy for the comparison to mean anything"
    # k3 at the sampled tokens estimates the sum over the vocabulary without bias, from ~90 tokens: within 2x
    assert exact / 2 < m["actor/policy_kl"] < exact * 2, (m["actor/policy_kl"], exact)
    assert "perf/actor_probe_s" in m

    w.apply_adjustments({"lr": 0.0})
    assert w.update_actor(batch, step=2)["actor/policy_kl"] == 0.0  # weights unchanged: exactly no shift

    plain = ActorWorker(config("guard.guards=[{name: non_finite}]", rows=rows, length=length))
    m = plain.update_actor(batch, step=1)
    assert "actor/policy_kl" not in m and "perf/actor_probe_s" not in m  # nobody needs it: not measured


def random_batch():
    """Four rows of random tokens laid out as the rollout writes them, with random advantages (the same on every
    rank: a data-parallel test gives each rank its share)."""
    from armor_core.dataproto.protocol import DataProto

    ids, attn, pos, resp = rollout_batch([3, 2, 3, 1], [3, 1, 2, 3], P=3, R=R, vocab=15)
    mask = attn[:, -R:]
    adv = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask
    batch = DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": attn, "position_ids": pos, "responses": resp,
                 "response_mask": mask, "advantages": adv}
    )  # fmt: skip
    return batch


def _one_step(rank: int, world: int) -> float:
    from armor_core.workers.actor.worker import ActorWorker

    batch = random_batch()
    mine = batch if world == 1 else batch[[rank, rank + 2]]
    w = ActorWorker(
        config("guard.guards=[{name: trust_region, params: {target_kl: 1.0e9}}]", "actor.lr=1e-3"),
        rank=rank,
        world_size=world,
    )
    return w.update_actor(mine, step=1)["actor/policy_kl"]


@pytest.mark.slow
def test_two_ranks_agree_on_the_policy_kl_of_the_whole_batch(tmp_path):
    (tmp_path / "one").mkdir(), (tmp_path / "two").mkdir()
    (alone,) = run_ranks(_one_step, 1, tmp_path / "one")
    ranks = run_ranks(_one_step, 2, tmp_path / "two")
    assert ranks[0] == ranks[1]  # every rank reads the same number: a collective verdict
    assert ranks[0] == pytest.approx(alone, rel=1e-4)  # the probe covers every row here: the whole batch's value


def _undone_under_fsdp2(rank: int, world: int) -> tuple[float, bool]:
    from armor_core.workers.actor.optim import local_params
    from armor_core.workers.actor.worker import ActorWorker

    batch = random_batch()
    need = "guard.guards=[{name: trust_region, params: {target_kl: 1.0e-9, skip_factor: 1.0}}]"
    w = ActorWorker(config(need, "actor.lr=1e-3", "actor.strategy=fsdp2"), rank=rank, world_size=world)
    before = [t.clone() for t in local_params(w.model)]
    m = w.update_actor(batch[[rank, rank + 2]], step=1)
    return m["actor/skipped_updates"], all(torch.equal(a, b) for a, b in zip(before, local_params(w.model)))


@pytest.mark.slow
def test_a_step_undone_under_fsdp2_puts_each_rank_shards_back(tmp_path):
    # the probe's forward gathers the root's parameters; they must be sharded again before the old shards go back
    ranks = run_ranks(_undone_under_fsdp2, 2, tmp_path)
    assert ranks == [(1.0, True), (1.0, True)]


@pytest.mark.slow
def test_a_batch_with_the_teachers_log_probs_gets_teacher_kl_beside_policy_kl():
    from armor_core.workers.actor.policy_shift import PROBE_ROWS
    from armor_core.workers.actor.worker import ActorWorker

    rows, length = PROBE_ROWS, 6
    w = ActorWorker(config("actor.lr=1e-4", rows=rows, length=length))  # the default guards: trust_region needs it
    batch = sampled_batch(w, rows)
    with torch.no_grad():  # the policy's own log-probs of its sampled tokens, the teacher's half of each
        own = next_token_log_probs(w.model, batch, length).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    batch.tensors["teacher_log_prob"] = own - math.log(2.0)
    m = w.update_actor(batch, step=1)
    # p_T / p_S = 1/2 at every token: (1/2 - 1) - ln(1/2) = 0.193147 per token
    assert m["actor/teacher_kl"] == pytest.approx(0.5 - 1 + math.log(2.0), rel=1e-3)
    assert "actor/policy_kl" in m
