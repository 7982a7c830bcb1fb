"""What each guard stage really carries, held to the contract's table (``interfaces.GUARD_STAGES``), and what the
driver does with the verdicts given before the update.

The stages run for real, in this process and without Ray: the driver's ``Step`` with a real actor worker of one
rank behind a stand-in worker group, the trainer's own selection of the ``update`` statistics, and its
``validate`` on a stand-in rollout. A spy on ``GuardRunner.observe`` records what each stage passes.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from armor_core import Verdict, hookimpl
from armor_core.dataproto.protocol import DataProto
from armor_core.interfaces import GUARD_STAGES
from armor_core.loop.step import Step, update_stats
from armor_core.stability.faults import Faults
from armor_core.stability.guard import GuardRunner
from armor_core.testing import registered
from armor_core.workers.api import ActorAPI

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models, one torch thread

BASE = [
    "data.train_batch_size=2",
    "rollout.n=2",
    "rollout.max_new_tokens=3",
    "data.max_prompt_length=4",
    "actor.lr=1e-3",
    "actor.warmup_steps=0",
    "engine.cpus_per_worker=1",
    "trainer.loggers=[]",
    "actor.skip_zero_advantage=false",
]
#: the responses' lengths (of 3 tokens at most: two are cut off) and scores of the 2 prompts x 2 samples
LENGTHS, SCORES = [3, 1, 2, 3], [1.0, 0.0, 0.5, 1.0]
#: the sampler's log-probs; 9 where the mask is 0, which no statistic may read
ROLLOUT_LOGP = -torch.tensor([[0.5, 1.0, 1.5], [2.0, 9.0, 9.0], [1.0, 1.0, 9.0], [0.5, 0.5, 0.5]])


def _config(*overrides: str):
    from armor_core.config.schema import load_config

    return load_config(None, [*BASE, *overrides])


def _batch() -> DataProto:
    from armor_core.testing.batches import rollout_batch

    ids, attn, pos, responses = rollout_batch([4, 4, 3, 3], LENGTHS, P=4, R=3, vocab=19)
    ids[1, :4] = ids[0, :4]  # two samples per prompt
    ids[3, :4] = ids[2, :4]
    return DataProto.from_dict(
        tensors={
            "input_ids": ids,
            "attention_mask": attn,
            "position_ids": pos,
            "responses": responses,
            "response_mask": attn[:, 4:].clone(),
            "rollout_log_probs": ROLLOUT_LOGP.clone(),
        },
        non_tensors={"uid": np.array([0, 0, 1, 1])},
    )


class _Group:
    """A worker group of one rank in this process, as ``engine.WorkerGroup`` is to the driver."""

    def __init__(self, worker) -> None:
        self.worker = worker

    def dispatch(self, method, *args, **kwargs):
        return getattr(self.worker, method.__name__)(*args, **kwargs)

    call = dispatch


class _Rollout:
    """``RolloutSource`` with its rows given: ``collect`` returns them, ``update`` is the actor's update."""

    def __init__(self, actor: _Group) -> None:
        self.actor = actor

    def collect(self, step, score, timer, metrics):
        return _batch(), torch.tensor(SCORES)

    def update(self, update_in, step, timer):
        return self.actor.dispatch(ActorAPI.update_actor, update_in, step)


def _step(cfg) -> tuple[Step, _Group]:
    from armor_core.config.schema import to_dict
    from armor_core.plugins import get_plugin_manager
    from armor_core.stability.guard import run_coefficients
    from armor_core.workers.actor.worker import ActorWorker

    pm = get_plugin_manager()
    actor = _Group(ActorWorker(to_dict(cfg), rank=0, world_size=1))
    guard = GuardRunner(cfg.guard.guards, run_values=run_coefficients(cfg.actor))
    estimator = pm.get("advantage_estimator", cfg.algorithm.adv_estimator)
    step = Step(cfg, pm, estimator, actor, None, _Rollout(actor), None, guard, Faults([]), None)
    return step, actor


@pytest.fixture
def shown(monkeypatch):
    """``{stage: [stats, ...]}`` of every ``GuardRunner.observe`` call, the driver's and the worker's."""
    seen: dict[str, list[dict[str, float]]] = {}
    observe = GuardRunner.observe

    def spy(self, stage, stats, step):
        seen.setdefault(stage, []).append(dict(stats))
        return observe(self, stage, stats, step)

    monkeypatch.setattr(GuardRunner, "observe", spy)
    return seen


def _check_against_the_table(stage: str, keys: set[str], present: set[str]) -> None:
    """``keys`` are the stage's required keys, the optional keys in ``present`` (those this run makes) and family
    members, nothing else."""
    spec = GUARD_STAGES[stage]
    undeclared = sorted(k for k in keys if not spec.declares(k))
    assert not undeclared, f"stage {stage!r} passes keys its GUARD_STAGES entry does not declare: {undeclared}"
    assert set(spec.keys) <= keys, f"stage {stage!r} lacks {sorted(set(spec.keys) - keys)}"
    assert keys & set(spec.optional) == present, f"stage {stage!r}: optional keys {sorted(keys & set(spec.optional))}"


@pytest.mark.parametrize("on_policy", [True, False])
def test_each_stage_passes_the_keys_the_contract_declares(shown, on_policy):
    # the mismatch guard sees advantage and grad (made-up log-probs: a limit it never reaches); trust_region opts
    # into step and needs policy_kl
    mismatch = "{name: rollout_mismatch, params: {max_diff_mean: 100}}"
    guards = f"guard.guards=[{{name: non_finite}}, {mismatch}, {{name: trust_region}}]"
    mini = 2 if on_policy else 1  # prompts per mini-batch: all of them is exactly on-policy
    step, _ = _step(_config(guards, f"actor.ppo_mini_batch_size={mini}"))
    res = step.run(1)
    assert res.updated and set(shown) == {"reward", "advantage", "grad", "step"}
    (reward,), (advantage,) = shown["reward"], shown["advantage"]
    _check_against_the_table("reward", set(reward), set())
    # the gap between the sampler's and the trainer's log-probs is known before the update only off-policy
    gap = {"rollout/logprob_diff_mean", "rollout/logprob_diff_max"}
    _check_against_the_table("advantage", set(advantage), {"rollout/entropy", *(() if on_policy else gap)})
    assert len(shown["grad"]) == len(shown["step"]) == (1 if on_policy else 2)  # per mini-batch
    for i, grad in enumerate(shown["grad"]):  # the worker measures the gap on its first mini-batch
        _check_against_the_table("grad", set(grad), gap if i == 0 else set())
    for stats in shown["step"]:
        _check_against_the_table("step", set(stats), {"policy_kl"})
    _check_against_the_table("update", set(update_stats(res.metrics)), {"rollout/entropy", *gap})
    assert "actor/policy_kl" in res.metrics and "actor/pg_clipfrac" in res.metrics  # family members, declared


def test_the_rollout_statistics_before_the_update_are_those_of_the_rows(shown):
    step, _ = _step(_config("actor.ppo_mini_batch_size=2"))
    res = step.run(1)
    (advantage,) = shown["advantage"]
    # by hand: lengths 3, 1, 2, 3 of at most 3 tokens; -log p over the 9 tokens the mask holds (never the 9s)
    assert advantage["response_length/mean"] == pytest.approx(9 / 4)
    assert (advantage["response_length/max"], advantage["response_length/min"]) == (3.0, 1.0)
    assert advantage["response_length/clip_ratio"] == pytest.approx(2 / 4)
    assert advantage["rollout/entropy"] == pytest.approx((0.5 + 1.0 + 1.5 + 2.0 + 1.0 + 1.0 + 1.5) / 9)
    assert (advantage["score/mean"], advantage["score/min"], advantage["score/max"]) == (0.625, 0.0, 1.0)
    assert shown["reward"] == [{"score/mean": 0.625, "score/min": 0.0, "score/max": 1.0}]
    assert res.metrics["rollout/entropy"] == advantage["rollout/entropy"]  # logged as well


def test_the_validation_stage_passes_the_keys_the_contract_declares():
    """``Trainer.validate`` on a stand-in rollout (each response its prompt's last token) and scorer."""
    from armor_core.loop.trainer import Trainer

    class Rollout:
        ranks = 1

        def generate(self, prompts, step, greedy):
            ids = prompts["input_ids"]
            out = ids[:, -1:]
            return DataProto.from_dict(tensors={"responses": out, "response_mask": torch.ones_like(out)})

    class Scorer:
        def score(self, full):
            scores = (full["responses"][:, 0] % 2).float()
            full["reward_components"] = np.array([{"d": (float(s), 1.0)} for s in scores], dtype=object)
            return scores, {}, [str(int(s)) for s in scores]

    ids = torch.tensor([[1, 2], [3, 4], [5, 6]])
    encoded = {
        "tensors": {"input_ids": ids, "attention_mask": torch.ones_like(ids), "position_ids": torch.zeros_like(ids)},
        "non_tensors": {"data_source": np.array(["a", "a", "b"], dtype=object)},
    }
    cfg = _config("trainer.val_n=2", "actor.ppo_mini_batch_size=2")
    trainer = SimpleNamespace(
        val_ds=SimpleNamespace(encoded=encoded), cfg=cfg, rollout=Rollout(), scorer=Scorer(), step=4, val_history=[]
    )
    val = Trainer.validate(trainer)
    _check_against_the_table("validation", set(val), set())
    assert val["val/acc_greedy"] == pytest.approx(0.0) and val["val/step"] == 4.0  # responses 2, 4, 6: all even
    assert {"val/a/acc_greedy", "val/b/acc_greedy", "val/mean@2"} <= set(val)  # members of the val/ family


def test_the_table_is_self_consistent():
    """``check_guard`` feeds each stage's ``typical`` values: every key a stage always carries has one, and none
    is a key the stage does not carry."""
    for name, spec in GUARD_STAGES.items():
        assert set(spec.keys) <= set(spec.typical), name
        assert all(spec.declares(k) for k in spec.typical), name
        assert not set(spec.keys) & set(spec.optional), name


# -- verdicts before the update ---------------------------------------------------------------------------------


def _at_advantage(verdict: Verdict):
    class Plugin:
        @hookimpl
        def armor_register_stability_guards(self, register):
            class AtAdvantage:
                stages = ("advantage",)

                def observe(self, stage, stats, step):
                    return verdict

                def state_dict(self):
                    return {}

                def load_state_dict(self, state):
                    pass

            register("at_advantage", AtAdvantage)

    return registered(Plugin())


def test_an_adjustment_before_the_update_applies_to_that_update(shown):
    with _at_advantage(Verdict("adjust", "entropy low", adjustments={"lr": 2e-4})):
        step, actor = _step(_config("guard.guards=[{name: at_advantage}]", "actor.ppo_mini_batch_size=2"))
        res = step.run(1)
    assert res.updated and res.verdicts == []  # nothing left for the trainer to act on
    assert res.metrics["actor/lr"] == pytest.approx(2e-4)  # the rate the update's optimizer step used
    assert res.metrics["guard/adjust/lr"] == pytest.approx(2e-4)


def test_a_skip_before_the_update_keeps_it_from_being_made(shown):
    with _at_advantage(Verdict("skip", "too long")):
        step, actor = _step(_config("guard.guards=[{name: at_advantage}]", "actor.ppo_mini_batch_size=2"))
        before = {k: v.clone() for k, v in actor.worker.model.state_dict().items()}
        res = step.run(1)
    assert not res.updated and res.metrics["guard/skipped_step"] == 1.0
    assert "grad" not in shown and not any(k.startswith("actor/pg_loss") for k in res.metrics)
    assert all(torch.equal(v, actor.worker.model.state_dict()[k]) for k, v in before.items())
