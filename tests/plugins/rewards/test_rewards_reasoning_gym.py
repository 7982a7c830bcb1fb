"""The ``reasoning_gym`` domain on the real reasoning-gym library: 1.0 for each dataset's own answer
(``entry["answer"]``), less for a wrong one, the ``<answer>`` tag read as reasoning-gym reads it, checkers that
need no oracle answer, the dataset's config honoured, ground truths refused at load, and scoring through the
reward manager in its pool."""

from __future__ import annotations

import json

import pytest

import armor_plugins.rewards.reasoning_gym as rg_reward
from armor_core.config.schema import ConfigError, RewardConfig
from armor_core.rewards.manager import RewardManager
from armor_core.testing import check_reward_domain, registered
from armor_plugins.rewards.reasoning_gym import extract_answer, reasoning_gym_reward
from armor_plugins.tasks.reasoning_gym import decode_ground_truth, generate_reasoning_gym

pytest.importorskip("reasoning_gym")

DATASETS = ["basic_arithmetic", "leg_counting", "spell_backward", "arc_agi"]


def _domain():
    with registered(rg_reward, load_entrypoints=False) as pm:
        return pm.get("reward_domain", "reasoning_gym")


def _answer(row):
    return decode_ground_truth(row["ground_truth"])[2]["answer"]


@pytest.mark.parametrize("dataset", DATASETS)
def test_the_datasets_own_answer_scores_one_and_a_wrong_one_less(dataset):
    rows = generate_reasoning_gym("test", 5, 0, dataset=dataset)
    cases = []
    for r in rows:
        answer = _answer(r)
        cases += [
            (r["prompt"], answer, r["ground_truth"], 1.0),
            (r["prompt"], f"  <think>so</think> <answer>{answer}</answer>\n", r["ground_truth"], 1.0),
        ]
    check_reward_domain(_domain(), cases, refused=["46", json.dumps({"dataset": "no_such_set", "entry": {}})])
    for r in rows:
        _, source, entry = decode_ground_truth(r["ground_truth"])
        for wrong in ("", "x" + _answer(r)[::-1] + "x"):
            out = reasoning_gym_reward(r["prompt"], wrong, r["ground_truth"], {})
            # the dataset's own partial credit (arc_agi gives 0.05 to any answer), never full marks
            assert out.score == source.score_answer(wrong, entry) < 1.0 and out.sub_scores["correct"] == 0.0


def test_the_answer_tag_is_read_as_reasoning_gym_reads_it():
    assert extract_answer("<answer>1</answer> then <answer> 42 </answer>") == ("42", True)  # the last tag
    assert extract_answer(" 42\n") == ("42", False)
    assert extract_answer(" 42\n", "required") == (None, False)
    assert extract_answer("<answer>42</answer>", "off") == ("<answer>42</answer>", False)
    row = generate_reasoning_gym("test", 1, 0, dataset="leg_counting")[0]
    tagged = f"<answer>{_answer(row)}</answer>"
    assert reasoning_gym_reward("", tagged, row["ground_truth"], {}).sub_scores == {"correct": 1.0, "tagged": 1.0}
    # without reading the tag, leg_counting's checker gives the text containing the answer partial credit
    assert 0 < reasoning_gym_reward("", tagged, row["ground_truth"], {}, answer_tag="off").score < 1
    assert reasoning_gym_reward("", _answer(row), row["ground_truth"], {}, answer_tag="required").score == 0.0
    with pytest.raises(ValueError, match="answer_tag='xml' must be one of auto, required, off"):
        extract_answer("42", "xml")


def test_a_checker_without_an_oracle_answer_is_the_datasets_own():
    # propositional_logic has no single answer: its checker tests the conclusion against the premises
    row = generate_reasoning_gym("test", 1, 0, dataset="propositional_logic")[0]
    name, dataset, entry = decode_ground_truth(row["ground_truth"])
    assert entry["answer"] is None and name == "propositional_logic"
    example = entry["metadata"]["example_answer"]
    assert reasoning_gym_reward("", example, row["ground_truth"], {}).score == dataset.score_answer(example, entry)
    assert reasoning_gym_reward("", example, row["ground_truth"], {}).score == 1.0


def test_the_rows_config_builds_the_scoring_dataset():
    config = {"min_terms": 3, "max_terms": 3}
    row = generate_reasoning_gym("test", 1, 0, dataset="chain_sum", config=config)[0]
    _, dataset, _ = decode_ground_truth(row["ground_truth"])
    assert (dataset.config.min_terms, dataset.config.max_terms) == (3, 3)
    assert decode_ground_truth(json.loads(row["ground_truth"]))[1] is dataset  # built once per config


def test_scored_by_the_reward_manager_in_its_pool():
    rows = generate_reasoning_gym("test", 4, 0, dataset="basic_arithmetic")
    responses = [_answer(rows[0]), "nonsense", f"<answer>{_answer(rows[2])}</answer>", ""]
    with registered(rg_reward, load_entrypoints=False) as pm:
        domain = pm.get("reward_domain", "reasoning_gym")
        assert not domain.inline and domain.requires_ground_truth
        with RewardManager(RewardConfig(num_workers=1), pm) as rm:
            rm.check_rows(rows, "rows")
            out = rm.score(
                [r["prompt"] for r in rows], responses, ["reasoning_gym"] * 4, [r["ground_truth"] for r in rows]
            )
            bad = {"prompt": "1+1=", "data_source": "reasoning_gym", "ground_truth": "2"}
            with pytest.raises((ConfigError, ValueError), match="is not a reasoning_gym row's"):
                rm.check_rows([bad], "rows")
    assert out.scores.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert out.metrics["reward/failures"] == 0.0 and out.metrics["reward/reasoning_gym/tagged"] == 0.25
