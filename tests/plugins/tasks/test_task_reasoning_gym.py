"""The ``reasoning_gym`` task on the real reasoning-gym library: rows of several datasets, the ground truth
decoding to the generator's own entry, disjoint splits (a small config space included), seeds, curricula,
prompt formats, the errors (an unknown dataset with its close names, a bad config), and the one-line error
when the library is missing."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import armor_plugins.tasks.reasoning_gym as rg_task
from armor_core import Task
from armor_core.errors import UserFacingError
from armor_core.testing import check_task, registered
from armor_plugins.tasks.reasoning_gym import decode_ground_truth, generate_reasoning_gym, make_dataset

reasoning_gym = pytest.importorskip("reasoning_gym")

#: a config space of 1-digit pairs: a few hundred questions, so seeds alone would repeat them across splits
SMALL = {
    "min_terms": 2,
    "max_terms": 2,
    "min_digits": 1,
    "max_digits": 1,
    "operators": ["+"],
    "allow_parentheses": False,
    "allow_negation": False,
}


def _questions(rows):
    return [json.loads(r["ground_truth"])["entry"]["question"] for r in rows]


def test_registered_through_the_hook():
    with registered(rg_task, load_entrypoints=False) as pm:
        task = pm.get("task", "reasoning_gym")
    assert task.fn is generate_reasoning_gym


@pytest.mark.parametrize("dataset", ["basic_arithmetic", "leg_counting", "arc_agi", "knights_knaves"])
def test_rows_carry_the_generators_own_entry(dataset):
    rows = check_task(Task(generate_reasoning_gym), size=12, dataset=dataset)
    # the same draw from reasoning-gym itself: the entries the task kept are among the generator's
    seed = int(np.random.SeedSequence([0, 0]).generate_state(1)[0])
    source = make_dataset(dataset, seed=seed, size=600)
    made = {e["question"]: e for e in (source[i] for i in range(len(source)))}
    for r in rows:
        assert r["data_source"] == "reasoning_gym" and r["dataset"] == dataset
        name, _, entry = decode_ground_truth(r["ground_truth"])
        original = made[entry["question"]]
        # tuples, integer keys and numpy scalars come back as the generator made them (arc_agi's grids are tuples)
        assert name == dataset and entry == {k: original[k] for k in ("question", "answer", "metadata")}
        assert r["prompt"] == entry["question"]


def test_splits_share_no_question_even_when_the_config_space_is_small():
    train = _questions(generate_reasoning_gym("train", 400, 0, dataset="basic_arithmetic", config=SMALL))
    held_out = {
        q
        for s in range(3)
        for q in _questions(generate_reasoning_gym("test", 100, s, dataset="basic_arithmetic", config=SMALL))
    }
    assert len(train) == 400 and not set(train) & held_out
    # about a hundred one-digit sums: each split cycles its own, the test split a fifth of them under any seed
    assert 60 <= len(set(train)) <= 120 and 10 <= len(held_out) <= 40
    assert set(_questions(generate_reasoning_gym("test", 100, 7, dataset="basic_arithmetic", config=SMALL))) == held_out


def test_questions_are_distinct_and_follow_the_seed():
    rows = generate_reasoning_gym("train", 200, 3, dataset="chain_sum")
    assert len(set(_questions(rows))) == 200
    assert rows == generate_reasoning_gym("train", 200, 3, dataset="chain_sum")
    assert rows != generate_reasoning_gym("train", 200, 4, dataset="chain_sum")
    assert rows == generate_reasoning_gym("train", 200, 4, dataset="chain_sum", data_seed=3)
    assert generate_reasoning_gym("val", 0, 0, dataset="chain_sum") == []


def test_the_config_and_the_curriculum_reach_the_generator():
    rows = generate_reasoning_gym("train", 30, 0, dataset="basic_arithmetic", config={"min_terms": 4, "max_terms": 4})
    assert {e["metadata"]["num_terms"] for e in (decode_ground_truth(r["ground_truth"])[2] for r in rows)} == {4}
    curriculum = reasoning_gym.factory.create_curriculum("basic_arithmetic")
    curriculum.set_global_level(0)
    low = curriculum.generate_configuration()
    rows = generate_reasoning_gym("train", 30, 0, dataset="basic_arithmetic", curriculum={"level": 0})
    terms = {decode_ground_truth(r["ground_truth"])[2]["metadata"]["num_terms"] for r in rows}
    assert terms <= set(range(low.min_terms, low.max_terms + 1))
    rows = generate_reasoning_gym(
        "train",
        30,
        0,
        dataset="basic_arithmetic",
        curriculum={"attribute_levels": {"num_terms": 3}, "mode": "upper_bound"},
    )
    assert json.loads(rows[0]["ground_truth"])["curriculum"]["attribute_levels"] == {"num_terms": 3}
    assert min(decode_ground_truth(r["ground_truth"])[2]["metadata"]["num_terms"] for r in rows) > low.max_terms


def test_chat_prompts_ask_for_an_answer_tag():
    row = generate_reasoning_gym("train", 1, 0, dataset="leg_counting", prompt_format="chat")[0]
    system, user = row["prompt"]
    assert system == {"role": "system", "content": reasoning_gym.utils.SYSTEM_PROMPTS["default"]}
    assert user["role"] == "user" and user["content"] == _questions([row])[0] and "<answer>" in system["content"]
    own = generate_reasoning_gym("train", 1, 0, dataset="leg_counting", prompt_format="chat", system_prompt="Be brief.")
    assert own[0]["prompt"][0]["content"] == "Be brief."


@pytest.mark.parametrize(
    "params, match",
    [
        ({"dataset": "basic_arithmatic"}, r"no dataset 'basic_arithmatic'; did you mean basic_arithmetic, "),
        ({"dataset": "sudoko"}, r"did you mean sudoku"),
        ({}, r"name the reasoning-gym dataset in data.task_kwargs.dataset"),
        ({"dataset": "chain_sum", "config": {"size": 5}}, r"config sets \['size'\]: ARMOR sets them"),
        (
            {"dataset": "chain_sum", "config": {"digits": 5}},
            r"no config field\(s\) \['digits'\]; its fields: .*max_digits",
        ),
        ({"dataset": "chain_sum", "config": {"min_terms": 5, "max_terms": 2}}, r"'chain_sum' refused its config"),
        ({"dataset": "chain_sum", "curriculum": {"attribute_levels": {"x": 1}}}, r"no attribute 'x'; its attributes: "),
        ({"dataset": "gsm_symbolic", "curriculum": {"level": 1}}, r"'gsm_symbolic' has no curriculum"),
        ({"dataset": "chain_sum", "prompt_format": "xml"}, r"prompt_format='xml' must be 'text' or 'chat'"),
    ],
)
def test_bad_parameters_are_refused_naming_the_dataset(params, match):
    with pytest.raises(ValueError, match=match):
        generate_reasoning_gym("train", 2, 0, **params)


def test_an_unknown_parameter_is_named():
    with pytest.raises(TypeError, match=r"unknown parameter\(s\) \['datasets'\]"):
        generate_reasoning_gym("train", 2, 0, datasets="chain_sum")


def test_without_the_library_armor_loads_and_the_task_says_how_to_install_it():
    # a child process where `import reasoning_gym` fails, as where the extra is not installed
    code = (
        "import sys; sys.modules['reasoning_gym'] = None\n"
        "from armor_core import get_plugin\n"
        "task = get_plugin('task', 'reasoning_gym')\n"
        "try:\n"
        "    task.fn('train', 2, 0, dataset='chain_sum')\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines() == [
        "ReasoningGymMissingError the reasoning_gym task and reward domain need the reasoning-gym library: "
        "pip install 'armor-rl[reasoning-gym]'"
    ]
    assert issubclass(rg_task.ReasoningGymMissingError, UserFacingError)
