"""The built-in ``arithmetic`` domain: the scores armor-rewards-math's ``arithmetic`` domain gave before it
moved here (``cases/arithmetic.jsonl``: the task's own rows with right, wrong, padded, signed, hedged and
full-width answers, and adversarial strings), its registration, and ground truths refused at load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import armor_plugins.rewards.arithmetic as arithmetic_plugin
from armor_core.config.schema import ConfigError, RewardConfig
from armor_core.rewards.manager import RewardManager
from armor_core.testing import registered
from armor_plugins.rewards.arithmetic import arithmetic_reward
from armor_plugins.tasks.arithmetic import generate_arithmetic

_LINES = (Path(__file__).parent / "cases" / "arithmetic.jsonl").read_text(encoding="utf-8").splitlines()
FIELDS = json.loads(_LINES[0])
CASES = [dict(zip(FIELDS, json.loads(line))) for line in _LINES[1:] if line.strip()]


def _text(value):
    # a long run of one character is stored as {"text": c, "times": n}
    return value["text"] * value["times"] if isinstance(value, dict) else value


def test_the_cases_cover_the_task_and_adversarial_strings():
    assert len(CASES) > 1000
    assert {c["strict"] for c in CASES} == {True, False}
    assert 0 < sum(c["score"] for c in CASES) < len(CASES) and any(c["hedged"] for c in CASES)


def test_scores_equal_the_math_packs_former_arithmetic_domain():
    wrong = []
    for c in CASES:
        out = arithmetic_reward(c["prompt"], _text(c["response"]), _text(c["ground_truth"]), {}, strict=c["strict"])
        got = (out.score, out.sub_scores["correct"], out.sub_scores["well_formed"], out.sub_scores["hedged"])
        if got != (c["score"], c["correct"], c["well_formed"], c["hedged"]):
            wrong.append((c, got))
    assert not wrong, wrong[:3]


def test_the_task_rows_route_to_it_and_score_through_the_manager():
    rows = generate_arithmetic("test", 50, seed=3, digits=2, ops="+-")
    with registered(arithmetic_plugin, load_entrypoints=False) as pm:
        domain = pm.get("reward_domain", "arithmetic")
        assert domain.inline and domain.requires_ground_truth
        with RewardManager(RewardConfig(), pm) as rm:
            batch = rm.score(
                [r["prompt"] for r in rows],
                [r["ground_truth"] if i % 2 else "0x" for i, r in enumerate(rows)],
                [r["data_source"] for r in rows],
                [r["ground_truth"] for r in rows],
                None,
            )
    assert batch.scores.tolist() == [float(i % 2) for i in range(len(rows))]


@pytest.mark.parametrize("truth", ["two", "4.5", "4 6", {"answer": 4}])
def test_a_ground_truth_that_is_no_integer_is_refused_at_load(truth):
    with registered(arithmetic_plugin, load_entrypoints=False) as pm:
        with RewardManager(RewardConfig(), pm) as rm, pytest.raises((ConfigError, ValueError), match="not an integer"):
            rm.check_rows([{"prompt": "1+1=", "data_source": "arithmetic", "ground_truth": truth}], "rows")
