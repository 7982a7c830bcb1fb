"""``armor run recipe:code``: the recipe resolves and validates, and a short run's held-out pass rate is the
warm start's, measured independently by running its greedy programs in the sandbox (armor-rewards-code)."""

from __future__ import annotations

import json

import pytest

from armor_core.cli.main import main
from armor_core.config.plugin_checks import validate_plugins
from armor_core.config.schema import load_config

pytest.importorskip("armor_rewards_code", reason="recipe:code scores with the code domain of armor-rewards-code")

SHORT = [
    "trainer.total_steps=2",
    "data.train_size=32",
    "data.val_size=24",
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=4",
    "rollout.n=4",
    "trainer.loggers=[jsonl]",
]


def test_the_recipe_resolves_and_validates():
    cfg = load_config("recipe:code", ["trainer.total_steps=3"])
    assert cfg.model.path == "builtin:code-ops-tiny" and cfg.data.task == "code_ops"
    assert cfg.reward.domain_kwargs["code"]["whole_response"] is True
    assert cfg.reward.domain_kwargs["code"]["total_timeout_s"] < cfg.reward.timeout_s
    validate_plugins(cfg)


@pytest.mark.slow
def test_a_short_run_validates_the_warm_starts_pass_rate(ray_cluster, tmp_path, one_thread):
    from armor_core.models.loading import load_model, load_tokenizer, resolve_model_path
    from armor_core.train.sft import evaluate_greedy
    from armor_core.train.sft_reward import reward_passed
    from armor_plugins.tasks.code_ops import generate_code_ops

    run_dir = tmp_path / "code"
    assert main(["run", "recipe:code", *SHORT, f"trainer.run_dir={run_dir}"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    before = summary["val_before"]["val/code/acc_greedy"]
    # the same held-out rows (test split, trainer.seed 1, two cases), greedy programs run in the sandbox here
    rows = [
        {"prompt": r["prompt"], "ground_truth": r["ground_truth"]} for r in generate_code_ops("test", 24, 1, cases=2)
    ]
    path = resolve_model_path("builtin:code-ops-tiny")
    with reward_passed("code", ["whole_response=true"]) as passed:
        expected = evaluate_greedy(load_model(path), load_tokenizer(path), rows, max_new_tokens=28, passed=passed)
    assert 0.2 < expected < 0.8 and before == pytest.approx(expected)
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [s for s in steps if "reward/code/compiled" in s]
    assert len(trained) == 2 and all(s["reward/code/compiled"] > 0.5 for s in trained)  # programs, not noise
