"""Validation with several samples per prompt: mean@n, best@n, maj@n per data source, in training
(``trainer.val_n``) and in ``armor eval --n`` (which also writes per-row results)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from armor_core.loop.validation import at_n_metrics

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: tiny models, one torch thread


def test_at_n_metrics_by_hand():
    # 3 prompts x n=4: two from "a", one from "b"
    responses = [
        "12",
        "13",
        "12 ",
        "7",  # a: "12" twice (the vote), correct twice
        "5",
        "6",
        "6",
        "5",  # a: 5 and 6 twice each: the tie goes to the first seen, "5", which is wrong
        "x",
        "y",
        "z",
        "y",
    ]  # b: "y" wins the vote and is right
    correct = np.array([1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1], dtype=bool)
    out = at_n_metrics(correct, responses, ["a", "a", "b"], 4)
    assert out["val/a/mean@4"] == pytest.approx(4 / 8)
    assert out["val/a/best@4"] == 1.0 and out["val/b/best@4"] == 1.0
    assert out["val/a/maj@4"] == pytest.approx(0.5)  # prompt 0 right, prompt 1 wrong
    assert out["val/b/maj@4"] == 1.0
    assert out["val/mean@4"] == pytest.approx(6 / 12) and out["val/maj@4"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="12 scores and 11 responses for 3 prompts x n=4"):
        at_n_metrics(correct, responses[:-1], ["a", "a", "b"], 4)


@pytest.mark.slow
def test_armor_eval_n_samples_and_writes_each_row(tmp_path):
    out = tmp_path / "rows.jsonl"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "armor_core.cli.main",
            "eval",
            "builtin:arithmetic-tiny",
            "--data",
            "task:arithmetic",
            "--size",
            "12",
            "--n",
            "4",
            "--output",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    for k in ("mean@4", "best@4", "maj@4", "arithmetic/mean@4", "acc_greedy"):
        assert 0.0 <= result[k] <= 1.0, k
    assert result["best@4"] >= result["mean@4"]  # any of 4 right is at least the average
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 12 and all(
        len(r["@4"]["responses"]) == 4 == len(r["@4"]["scores"]) and len(r["greedy"]["responses"]) == 1 for r in rows
    )
    mean = np.mean(
        [s >= 1.0 for r in rows for s in r["@4"]["scores"]]
    )  # arithmetic alone: the score is the correctness
    assert result["mean@4"] == pytest.approx(mean)
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "armor_core.cli.main",
            "eval",
            "builtin:arithmetic-tiny",
            "--data",
            "task:arithmetic",
            "--n",
            "4",
            "--output",
            str(tmp_path / "missing" / "rows.jsonl"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr


def test_multi_turn_validation_sends_rows_and_scores_the_final_turn():
    """With multi-turn rollouts the environments get the rows' columns, and the domains score the episode's
    final turn (``reward_text``), not every sampled id decoded; an environment's reward parts join the score."""
    import torch

    from armor_core.config.schema import RewardConfig
    from armor_core.dataproto.protocol import DataProto
    from armor_core.loop.step import Scorer
    from armor_core.loop.validation import run_validation
    from armor_core.plugins import get_plugin_manager
    from armor_core.rewards.manager import RewardManager

    data = DataProto.from_dict(
        tensors={
            "input_ids": torch.ones(2, 3, dtype=torch.long),
            "attention_mask": torch.ones(2, 3, dtype=torch.long),
            "position_ids": torch.arange(3).repeat(2, 1),
        },
        non_tensors={
            "raw_prompt": np.array(["2+2=", "3+3="], dtype=object),
            "data_source": np.array(["arithmetic"] * 2, dtype=object),
            "ground_truth": np.array(["4", "6"], dtype=object),
            "extra": np.array([{"k": 0}, {"k": 1}], dtype=object),
        },
    )
    seen = []

    def generate(prompts, greedy):
        seen.append(dict(prompts.non_tensors))
        # the sampled ids decode to garbage; the episodes' final turns are the answers
        out = DataProto.from_dict(
            tensors={"responses": torch.full((2, 2), 5), "response_mask": torch.ones(2, 2, dtype=torch.long)},
            non_tensors={
                "reward_text": np.array(["4", "7"], dtype=object),
                "env_reward_parts": np.array([{"solved": 0.5}, {}], dtype=object),
            },
        )
        return out

    class Tok:
        def batch_decode(self, rows, skip_special_tokens=True):
            return ["garbage"] * len(rows)

    rewards = RewardManager(RewardConfig(), get_plugin_manager())
    try:
        out = run_validation(data, generate, Scorer(rewards, Tok()), ranks=1, val_n=1, sampled=False, multi_turn=True)
    finally:
        rewards.close()
    assert [e["k"] for e in seen[0]["extra"]] == [0, 1]  # the rows went with the prompts
    # "4" is right, "7" is wrong: half correct; the environment's 0.5 is a component, not correctness
    assert out["val/arithmetic/acc_greedy"] == 0.5


def test_armor_eval_runs_multi_turn_episodes():
    """``armor eval`` builds the configured rollout: with multi-turn on, episodes with the environment (the tiny
    model calls no tool, so each ends after its first turn and scores as the single-turn evaluation does)."""

    def evaluate(*overrides):
        run = subprocess.run(
            [sys.executable, "-m", "armor_core.cli.main", "eval", "builtin:arithmetic-tiny", "--data",
             "task:arithmetic", "--size", "16", "--json", *overrides],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-2000:]
        return json.loads(run.stdout)

    tools = "rollout.multi_turn.environment_kwargs={tools: ['armor_plugins.environments.builtin_tools:calculator']}"
    multi = evaluate("rollout.multi_turn.enable=true", tools)
    assert multi["acc_greedy"] == evaluate()["acc_greedy"]
    bad = subprocess.run(
        [sys.executable, "-m", "armor_core.cli.main", "eval", "builtin:arithmetic-tiny", "--data", "task:arithmetic",
         "--size", "4", "rollout.multi_turn.enable=true", "rollout.multi_turn.environment=nosuch"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bad.returncode == 2 and "unknown environment 'nosuch'" in bad.stderr and "Traceback" not in bad.stderr


class _Mirror:
    """An environment that answers the first turn with a tool result and pays its own reward part."""

    def __init__(self, row, *, seed=0):
        pass

    def reset(self):
        return None

    def step(self, turn):
        from armor_core.interfaces import EnvironmentStep

        if turn.index == 0:
            return EnvironmentStep(observation=[{"role": "tool", "content": "7"}])
        return EnvironmentStep(done=True, reward_parts={"solved": 0.25})


@pytest.mark.slow
def test_armor_eval_scores_environment_parts_and_writes_each_episodes_turns(tmp_path):
    """``armor eval`` scores as training does (an environment's reward parts are in the score), and ``-o`` shows
    each episode turn by turn: the role, the text, and whether its tokens were the policy's."""
    from armor_core import hookimpl
    from armor_core.cli.eval import evaluate
    from armor_core.models.loading import load_tokenizer
    from armor_core.testing import registered

    class Plugin:
        @hookimpl
        def armor_register_environments(self, register):
            register("mirror", _Mirror)

    rows = tmp_path / "rows.jsonl"
    with registered(Plugin()):
        result = evaluate(
            "builtin:arithmetic-tiny", "task:arithmetic", size=4, output=str(rows),
            overrides=["rollout.multi_turn.enable=true", "rollout.multi_turn.environment=mirror",
                       "rollout.multi_turn.max_turns=2", "rollout.max_new_tokens=3"],
        )  # fmt: skip
    written = [json.loads(line) for line in rows.read_text().splitlines()]
    eos = load_tokenizer("builtin:arithmetic-tiny").eos_token
    scores = [s for r in written for s in r["greedy"]["scores"]]
    assert all(s in (0.25, 1.25) for s in scores)  # arithmetic's 0 or 1, plus the environment's 0.25
    assert result["arithmetic/score_greedy"] == pytest.approx(np.mean(scores))
    for r in written:
        (episode,) = r["greedy"]["episodes"]
        turns = episode["turns"]
        assert episode["end"] == "done" and [t["role"] for t in turns] == ["assistant", "tool", "assistant"]
        assert [t["policy"] for t in turns] == [True, False, True] and "7" in turns[1]["text"]
        # the final turn is what was scored; the text shows the end-of-turn token the policy sampled
        assert turns[2]["text"].replace(eos, "").strip() == r["greedy"]["responses"][0].strip()
