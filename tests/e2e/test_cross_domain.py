"""``armor run recipe:cross_domain``: the shipped recipe resolves, validates, and a short run prints
held-out accuracy per data_source before and after."""

from __future__ import annotations

import json

import pytest

from armor_core.cli import main
from armor_core.config import ConfigError, load_config
from armor_core.config_plugins import validate_plugins
from armor_core.recipes import recipe_names

SHORT = ["trainer.total_steps=2", "data.train_size=64", "data.val_size=48", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4",
         "rollout.n=2", "trainer.loggers=[jsonl]", "engine.cpus_per_worker=1"]


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
