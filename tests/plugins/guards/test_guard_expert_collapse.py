"""``expert_collapse``: a rollback with a lower rate when an MoE model's expert load collapses; added to the default
stack for MoE models only, and never to a stack the user set."""

from __future__ import annotations

import pytest

from armor_core.config.schema import load_config
from armor_core.loop.guard_defaults import model_guards
from armor_core.models.loading import build_char_tokenizer, build_tiny_model
from armor_plugins.guards.expert_collapse import ExpertCollapseGuard


def _feed(guard, values, start=1):
    return [guard.observe("update", {"moe/load_entropy": v}, step) for step, v in enumerate(values, start)]


def test_a_fall_below_the_runs_own_first_updates_rolls_back_to_before_it_with_half_the_rate():
    guard = ExpertCollapseGuard(lr=1e-4)
    # the first five updates set the baseline (median 0.9); noise around it is no collapse
    verdicts = _feed(guard, [0.88, 0.9, 0.92, 0.9, 0.89, 0.84, 0.93, 0.5, 0.45])
    assert [v.action for v in verdicts[:8]] == ["proceed"] * 8  # one low update is not yet a collapse
    last = verdicts[8]
    assert last.action == "rollback" and last.adjustments == {"lr": 5e-5}
    assert last.since == 7, "the last good value was measured at step 7: the updates from 7 on are suspect"
    assert last.threshold == pytest.approx(0.9 - 0.27)
    # the cut is kept: a second collapse halves it again
    assert _feed(guard, [0.4, 0.4], start=10)[1].adjustments == {"lr": 2.5e-5}


def test_a_model_already_leaning_on_few_experts_is_judged_against_its_own_balance():
    guard = ExpertCollapseGuard(lr=1e-4)
    assert all(v.action == "proceed" for v in _feed(guard, [0.3, 0.32, 0.31, 0.3, 0.29, 0.25, 0.24, 0.26]))
    assert _feed(guard, [0.15, 0.1], start=9)[1].action == "rollback"


def test_a_dense_run_is_never_judged():
    guard = ExpertCollapseGuard()
    assert all(guard.observe("update", {"actor/pg_loss": 0.1}, s).action == "proceed" for s in range(1, 30))


def _model_dir(tmp_path, arch):
    tok = build_char_tokenizer("0123456789+=")
    build_tiny_model(arch, len(tok), hidden_size=64, num_layers=2, num_heads=2).save_pretrained(tmp_path / arch)
    tok.save_pretrained(tmp_path / arch)
    return tmp_path / arch


def test_the_default_stack_gains_the_guard_for_an_moe_model_only_and_a_users_stack_never(tmp_path):
    moe, dense = _model_dir(tmp_path, "deepseek_v3"), _model_dir(tmp_path, "qwen2")
    names = lambda overrides: [g["name"] for g in model_guards(load_config(None, overrides))]  # noqa: E731
    assert names([f"model.path={moe}"]) == ["non_finite", "trust_region", "expert_collapse"]
    assert names([f"model.path={dense}"]) == ["non_finite", "trust_region"]
    assert names([]) == ["non_finite", "trust_region"]  # the built-in model is dense
    assert names([f"model.path={moe}", "guard.guards=[non_finite]"]) == ["non_finite"]
    tuned = [f"model.path={moe}", "guard.guards=[{name: non_finite}, {name: trust_region, params: {target_kl: 0.1}}]"]
    assert names(tuned) == ["non_finite", "trust_region"]
