"""``armor_core.testing``'s contract checks: one per plugin kind, every built-in passes its own,
and each check fails on an implementation that breaks what it checks."""

from __future__ import annotations

import pytest
import torch

from armor_core.interfaces import KINDS, KLEstimator, LossAggregation, RewardDomain, Task
from armor_core.plugins import get_plugin_manager
from armor_core.testing import (
    CHECKS,
    check_kl_estimator,
    check_loss_aggregation,
    check_metric_tracker,
    check_reward_domain,
    check_rollout_backend,
    check_task,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models, one torch thread


def test_every_plugin_kind_has_a_check():
    assert set(CHECKS) == set(KINDS)


def test_every_check_is_documented_with_its_signature():
    import inspect
    import re
    from pathlib import Path

    page = (Path(__file__).parents[3] / "docs" / "testing-plugins.md").read_text()
    for kind, check in CHECKS.items():
        row = next((line for line in page.splitlines() if line.startswith(f"| `{check.__name__}(")), None)
        assert row is not None, f"docs/testing-plugins.md has no row for {check.__name__}"
        assert f"| `{kind}` |" in row, f"{check.__name__}'s row does not name its kind {kind}"
        written = re.match(rf"\| `{check.__name__}\((.*?)\)` \|", row).group(1)
        names = [p.split("=")[0].strip(" *") for p in written.split(",")]
        assert [n for n in names if n] == list(inspect.signature(check).parameters), check.__name__


#: parameters a built-in needs to run at all
PARAMS = {
    ("task", "mix"): {"tasks": ["arithmetic", "facts"]},
    ("task", "reasoning_gym"): {"dataset": "basic_arithmetic"},
    ("task", "text_game"): {"env_id": "GuessTheNumber-v0"},
}


@pytest.mark.parametrize(
    "kind, check",
    [("kl_estimator", check_kl_estimator), ("loss_aggregation", check_loss_aggregation), ("task", check_task)],
)
def test_every_built_in_passes_its_check(kind, check):
    pm = get_plugin_manager()
    for name in pm.names(kind):
        check(pm.get(kind, name), **PARAMS.get((kind, name), {}))


@pytest.mark.parametrize("name", ["console", "jsonl", "tensorboard"])
def test_built_in_trackers_pass_their_check(name, tmp_path):
    check_metric_tracker(get_plugin_manager().get("metric_tracker", name), tmp_path)
    if name == "jsonl":  # resume(2) dropped step 3, which was then logged again once
        steps = [line for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert len(steps) == 3


def test_the_hf_backend_passes_its_check():
    from armor_core.models.loading import build_char_tokenizer, build_tiny_model

    tok = build_char_tokenizer("0123456789+=")
    model = build_tiny_model("qwen2", len(tok), hidden_size=64, num_layers=2, num_heads=2, seed=0)
    out = check_rollout_backend(get_plugin_manager().get("rollout_backend", "hf"), model, tok)
    assert out["responses"].shape[0] == 3


def test_the_checks_fail_on_broken_implementations():
    with pytest.raises(AssertionError, match="between a policy and itself should be 0"):
        check_kl_estimator(KLEstimator(fn=lambda lp, ref: (lp - ref) ** 2 + 0.1))
    with pytest.raises(AssertionError, match="not finite"):
        check_kl_estimator(KLEstimator(fn=lambda lp, ref: torch.exp(ref - lp) ** 3 - 1))
    with pytest.raises(AssertionError, match="outside the response mask"):
        check_loss_aggregation(LossAggregation(fn=lambda mat, mask, **_: mat.mean()))
    rows = lambda split, size, seed: [{"prompt": f"q{i}", "data_source": "t", "ground_truth": i} for i in range(size)]  # noqa: E731
    with pytest.raises(AssertionError, match="train and test share prompts"):
        check_task(Task(fn=rows))

    # a tool task: one question, each row's answer in a table the policy reads only through the tool
    def tables(split, size, seed, same=False):
        base = 0 if same or split == "train" else 1000
        return [
            {"prompt": "value of ab?", "data_source": "t", "ground_truth": i,
             "extra_info": {"tools_kwargs": {"lookup": {"table": {"ab": base + i}}}}}
            for i in range(size)
        ]  # fmt: skip

    check_task(Task(fn=tables))  # new tables in test: new problems, although the question repeats
    with pytest.raises(AssertionError, match="train and test share prompts"):
        check_task(Task(fn=tables), same=True)  # the same tables in both splits: the answers leak


def _last_word(prompt, response, ground_truth, extra, *, case_sensitive=True):
    said = (response.split() or [""])[-1]
    return float(said == ground_truth if case_sensitive else said.lower() == ground_truth.lower())


def _one_word(ground_truth, extra):
    if not isinstance(ground_truth, str) or len(ground_truth.split()) != 1:
        raise ValueError(f"expected one word, got {ground_truth!r}")


def test_a_registered_domain_takes_its_parameters_as_training_passes_them():
    domain = RewardDomain(_last_word, validate_ground_truth=_one_word)
    assert domain("q", "it is Paris", "paris", {}, case_sensitive=False).score == 1.0
    assert domain("q", "it is Paris", "paris").score == 0.0
    check_reward_domain(domain, [("q", "it is Paris", "paris", 1.0)], case_sensitive=False)
    with pytest.raises(AssertionError, match="unknown parameter 'case_sensitiv'"):
        check_reward_domain(domain, [("q", "it is Paris", "paris", 1.0)], case_sensitiv=False)


def test_check_reward_domain_runs_the_ground_truth_check():
    domain = RewardDomain(_last_word, validate_ground_truth=_one_word)
    check_reward_domain(domain, [("q", "Paris", "Paris", 1.0)], refused=["two words", 7])
    # a case whose ground truth the domain's own check refuses: training would refuse the row at load
    with pytest.raises(AssertionError, match="validate_ground_truth refuses the ground truth 'New York'"):
        check_reward_domain(domain, [("q", "New York", "New York", 0.0)])
    with pytest.raises(AssertionError, match="accepted the ground truth 'Paris', listed in refused"):
        check_reward_domain(domain, [("q", "Paris", "Paris", 1.0)], refused=["Paris"])
    one_argument = RewardDomain(_last_word, validate_ground_truth=lambda ground_truth: None)
    with pytest.raises(AssertionError, match=r"validate_ground_truth\(ground_truth, extra\)"):
        check_reward_domain(one_argument, [("q", "Paris", "Paris", 1.0)])
