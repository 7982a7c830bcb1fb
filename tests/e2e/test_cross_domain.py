"""``armor run recipe:cross_domain``: the shipped recipe resolves and validates, held-out accuracy
counts the correctness domain alone, and a short run prints accuracy per data_source before and after."""

from __future__ import annotations

import json

import pytest

from armor_core.cli.main import main
from armor_core.config.plugin_checks import validate_plugins
from armor_core.config.recipes import recipe_names
from armor_core.config.schema import ConfigError, load_config
from armor_core.loop.validation import accuracy_by_source, main_scores

SHORT = [
    "trainer.total_steps=2",
    "data.train_size=64",
    "data.val_size=48",
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=4",
    "rollout.n=2",
    "trainer.loggers=[jsonl]",
    "engine.cpus_per_worker=1",
]


def test_the_recipe_resolves_and_its_config_validates():
    assert "cross_domain" in recipe_names()
    cfg = load_config("recipe:cross_domain", ["trainer.total_steps=7"])
    assert cfg.trainer.total_steps == 7  # overrides still apply after a recipe
    assert cfg.model.path == "builtin:cross-domain-tiny" and cfg.data.task == "mix"
    assert set(cfg.data.task_kwargs["tasks"]) == {"arithmetic", "facts"}
    for source in ("arithmetic", "multiple_choice", "short_answer"):
        route = cfg.reward.domain_map[source]
        assert route[source] == 1.0 and 0 < route["format"] < 1 and 0 < route["length"] < 1
    validate_plugins(cfg)


def test_an_unknown_recipe_lists_the_recipes():
    with pytest.raises(ConfigError, match=r"unknown recipe 'recipe:cross_domian'.*recipe:cross_domain"):
        load_config("recipe:cross_domian")


def test_accuracy_counts_the_correctness_domain_alone():
    # per row {domain: (score, weight)}; the main domain is the largest weight, the first on a tie
    components = [
        {"arithmetic": (1.0, 1.0), "format": (0.0, 0.1), "length": (1.0, 0.1)},  # right, badly formatted: 1.1
        {"arithmetic": (0.0, 1.0), "format": (1.0, 0.5), "length": (1.0, 0.5)},  # wrong, well formatted: 1.0
        {"short_answer": (1.0, 0.5), "format": (0.0, 0.5)},  # tie: the first domain counts
    ]
    main = main_scores(components)
    assert main.tolist() == [1.0, 0.0, 1.0]
    scores = [sum(s * w for s, w in c.values()) for c in components]
    acc = accuracy_by_source(scores, ["arithmetic", "arithmetic", "short_answer"], "greedy", prefix="val/", main=main)
    assert acc["val/arithmetic/acc_greedy"] == 0.5 and acc["val/short_answer/acc_greedy"] == 1.0
    assert acc["val/acc_greedy"] == pytest.approx(2 / 3) and acc["val/arithmetic/score_greedy"] == pytest.approx(1.05)


@pytest.mark.slow
def test_a_short_run_prints_the_per_domain_table(ray_cluster, tmp_path, capsys):
    run_dir = tmp_path / "cd"
    assert main(["run", "recipe:cross_domain", *SHORT, f"trainer.run_dir={run_dir}"]) == 0
    out = capsys.readouterr().out
    summary = json.loads((run_dir / "summary.json").read_text())
    for source in ("arithmetic", "multiple_choice", "short_answer"):
        key = f"val/{source}/acc_greedy"
        before, after = summary["val_before"][key], summary["val_after"][key]
        row = next(line for line in out.splitlines() if key in line)
        assert f"{before:.3f}" in row and f"{after:.3f}" in row and f"{(after - before) * 100:+.1f} pts" in row
    assert "held-out accuracy per data_source" in out
