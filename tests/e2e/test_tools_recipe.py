"""``recipe:tools`` end to end for two steps at tiny sizes: the shipped warm start calls ``lookup`` in its own
turn, the tool's results reach it masked out of the loss, the final turns are scored, held-out success is
measured before and after, and the trainer's log-probs are the sampler's."""

from __future__ import annotations

import json

import pytest

from armor_core.config.schema import load_config
from armor_core.loop.trainer import Trainer

pytestmark = pytest.mark.slow


def test_the_tools_recipe_calls_the_tool_and_trains_on_its_own_tokens(ray_cluster, tmp_path):
    cfg = load_config(
        "recipe:tools",
        [
            "data.train_size=32",
            "data.val_size=16",
            "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=4",
            "rollout.n=4",
            "trainer.total_steps=2",
            "trainer.val_freq=0",
            "trainer.loggers=[jsonl]",
            f"trainer.run_dir={tmp_path / 'run'}",
        ],
    )
    assert cfg.rollout.multi_turn.enable and cfg.model.path == "builtin:tools-tiny"
    trainer = Trainer(cfg)
    try:
        trainer.fit()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        # the warm start calls the tool in (nearly) every episode, then answers: two turns, ended by itself
        assert r["env/tool_calls"] >= 0.75 and r["env/turns"] >= 1.75 and r["env/ended_done"] == 1.0
        # the results are in the sequence but not trained on: a call is ~45 tokens, a result ~4 to ~30
        assert 0.03 < r["env/masked_share"] < 0.5 and r["env/observation_tokens"] > 0
        assert 0.0 <= r["reward/source/table_lookup/score"] <= 1.0
        if "rollout/logprob_diff_max" in r:  # measured on the rows that carry a gradient
            assert r["rollout/logprob_diff_max"] < 1e-3
    val = [r["val/table_lookup/acc_greedy"] for r in rows if "val/table_lookup/acc_greedy" in r]
    assert len(val) == 2 and all(0.0 <= v <= 1.0 for v in val)
    assert val[0] > 0.0  # the warm start solves some held-out questions through the tool before any RL


def test_the_tools_recipe_with_its_lookup_tool_served_over_mcp(ray_cluster, tmp_path, mcp_table_server):
    """The same recipe with ``lookup`` from a stdio MCP server the rollout worker starts (the row's table a hidden
    argument): the warm start calls it and is answered, and the run trains on its own tokens."""
    server = json.dumps({**mcp_table_server, "tools": ["lookup"], "timeout_s": 5})
    cfg = load_config(
        "recipe:tools",
        [
            "data.train_size=16",
            "data.val_size=4",
            "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=4",
            "rollout.n=2",
            "trainer.total_steps=2",
            "trainer.val_freq=0",
            "trainer.val_before_train=false",
            "trainer.loggers=[jsonl]",
            f"trainer.run_dir={tmp_path / 'run'}",
            "rollout.multi_turn.environment_kwargs.tools=[]",
            f"rollout.multi_turn.environment_kwargs.mcp_servers=[{server}]",
        ],
    )
    trainer = Trainer(cfg)
    try:
        trainer.fit()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:  # as with the built-in tool: calls answered by the server, results masked out of the loss
        assert r["env/tool_calls"] >= 0.75 and r["env/ended_done"] == 1.0
        assert r["env/tool_errors"] <= 0.25 * r["env/tool_calls"]
        assert 0.03 < r["env/masked_share"] < 0.5 and r["env/observation_tokens"] > 0
