"""``armor run recipe:moe``: GRPO on the DeepSeek-V3-architecture warm start. The recipe resolves with routing replay
and the expert-collapse guard, and a short run validates the warm start's accuracy, logs the experts' load, and
scores the rollout's tokens in the trainer to rounding with the rollout's routes replayed."""

from __future__ import annotations

import json

import pytest

from armor_core.cli.main import main
from armor_core.config.plugin_checks import validate_plugins
from armor_core.config.recipes import recipe_names
from armor_core.config.schema import ConfigError, load_config
from armor_core.loop.guard_defaults import model_guards

SHORT = [
    "trainer.total_steps=3",
    "data.train_size=64",
    "data.val_size=64",
    "data.train_batch_size=4",
    "actor.ppo_mini_batch_size=4",
    "rollout.n=4",
    "trainer.loggers=[jsonl]",
]


def test_the_recipe_resolves_with_routing_replay_and_the_expert_guard():
    assert "moe" in recipe_names()
    cfg = load_config("recipe:moe", [])
    assert cfg.model.path == "builtin:moe-tiny" and cfg.rollout.routing_replay is True
    assert [g["name"] for g in model_guards(cfg)] == ["non_finite", "trust_region", "expert_collapse"]
    validate_plugins(cfg)
    with pytest.raises(ConfigError, match="routing_replay=true with rollout.backend=vllm"):
        load_config("recipe:moe", ["rollout.backend=vllm"])
    with pytest.raises(ConfigError, match="routing_replay=true with rollout.multi_turn.enable=true"):
        load_config("recipe:moe", ["rollout.multi_turn.enable=true"])


@pytest.mark.slow
def test_a_short_run_of_the_moe_recipe(ray_cluster, tmp_path, one_thread):
    from armor_core.models.loading import load_model, load_tokenizer
    from armor_core.train.sft import evaluate_greedy
    from armor_plugins.tasks.arithmetic import generate_arithmetic

    run_dir = tmp_path / "moe"
    assert main(["run", "recipe:moe", *SHORT, f"trainer.run_dir={run_dir}"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = generate_arithmetic("test", 64, seed=1)  # the run's held-out rows (trainer.seed 1)
    expected = evaluate_greedy(load_model("builtin:moe-tiny"), load_tokenizer("builtin:moe-tiny"), rows)
    assert 0.3 < expected < 0.8 and summary["val_before"]["val/acc_greedy"] == pytest.approx(expected)
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # a step whose every group scored alike has no advantage, so no training forward routed anything
    trained = [s for s in steps if s.get("actor/zero_adv_rows", 1.0) < 1.0]
    assert len(trained) >= 2 and all("moe/load_entropy" in s for s in trained)
    for s in trained:
        assert 0.5 < s["moe/load_entropy"] <= 1 and 1 <= s["moe/load_max"] <= 4
        assert s["rollout/logprob_diff_max"] < 1e-4  # the trainer scores what the rollout sampled, routes replayed
