"""The built-in ``facts`` and ``mix`` tasks: rows, determinism, the held-out rule, and ground truths
their reward domains accept."""

from __future__ import annotations

from collections import Counter

import pytest

import armor_plugins.tasks.facts as facts_module
import armor_plugins.tasks.mix as mix_module
from armor_core.config.schema import RewardConfig
from armor_core.rewards.manager import RewardManager
from armor_core.testing import registered
from armor_plugins.tasks.facts import CELLS, generate_facts, knowledge_base, question
from armor_plugins.tasks.mix import generate_mix, shares

FORM_OF = {"short_answer": "short", "multiple_choice": "choice"}


def _cell(row: dict) -> tuple[str, str, int]:
    return row["language"], FORM_OF[row["data_source"]], row["phrasing"]


def _fact_key(row: dict) -> tuple[str, str]:
    return row["entity"], row["attribute"]


def test_registered_through_the_hook():
    with registered(facts_module, load_entrypoints=False) as pm:
        assert pm.get("task", "facts").fn is generate_facts
    with registered(mix_module, load_entrypoints=False) as pm:
        assert pm.get("task", "mix").fn is generate_mix


def test_rows_cover_both_languages_and_forms_with_right_answers():
    kb = {(f.entity, f.attribute): f for f in knowledge_base()}
    rows = generate_facts("train", 2000, 0)
    assert len(rows) == 2000
    assert set(Counter(_cell(r) for r in rows)) == set(CELLS)
    for r in rows:
        fact = kb[_fact_key(r)]
        lang, text = r["language"], question(fact, r["language"], r["phrasing"])
        assert r["prompt"].startswith(text)
        if r["data_source"] == "short_answer":
            assert r["prompt"] == text and r["ground_truth"] == fact.values[lang] and "options" not in r
        else:
            options = r["options"]
            assert list(options) == ["A", "B", "C", "D"] and len(set(options.values())) == 4
            assert r["ground_truth"] == fact.values[lang]  # the right option's text (choice_answer: text)
            assert r["prompt"].endswith(" ".join(f"{k}.{v}" for k, v in options.items()))
    zh = next(
        r for r in rows if r["language"] == "zh" and r["attribute"] == "colour" and r["data_source"] == "short_answer"
    )
    assert zh["prompt"].endswith(("国旗的颜色？", "国旗是什么颜色？")) and zh["ground_truth"].endswith("色")


def test_choice_answer_letter_gives_the_right_letter():
    text = generate_facts("train", 300, 0, forms="choice")
    letter = generate_facts("train", 300, 0, forms="choice", choice_answer="letter")
    assert [r["prompt"] for r in text] == [r["prompt"] for r in letter]
    for t, r in zip(text, letter):
        assert r["ground_truth"] in "ABCD" and r["options"][r["ground_truth"]] == t["ground_truth"]


def test_same_arguments_same_rows_and_the_seed_changes_only_the_draw():
    assert generate_facts("train", 300, 7) == generate_facts("train", 300, 7)
    assert generate_facts("test", 300, 7) == generate_facts("test", 300, 7)
    assert generate_facts("train", 300, 7) != generate_facts("train", 300, 8)
    # the knowledge base and the held-out cells do not depend on the row seed
    short = lambda seed: {r["prompt"]: r["ground_truth"] for r in generate_facts("test", 192, seed, forms="short")}  # noqa: E731
    assert short(1) == short(2)
    assert knowledge_base(48, 0) != knowledge_base(48, 1)


def test_no_prompt_in_both_splits_and_every_tested_fact_is_taught():
    test = [r for seed in (0, 1, 2) for r in generate_facts("test", 1000, seed)]
    train = [r for seed in (0, 3, 9) for r in generate_facts("train", 3000, seed)]
    assert not {r["prompt"] for r in test} & {r["prompt"] for r in train}
    # a test question asks a trained fact, in a cell never trained for that fact
    trained_cells = {(_fact_key(r), _cell(r)) for r in train}
    trained_facts = {k for k, _ in trained_cells}
    for r in test:
        assert _fact_key(r) in trained_facts
        assert (_fact_key(r), _cell(r)) not in trained_cells


def test_test_split_asks_each_fact_once_in_balanced_cells():
    rows = generate_facts("test", 4 * 48, 0)
    assert len({_fact_key(r) for r in rows}) == 4 * 48
    assert Counter(_cell(r) for r in rows) == {c: 24 for c in CELLS}


def test_restricting_languages_and_forms():
    rows = generate_facts("train", 500, 0, languages="zh", forms=["choice"])
    assert {_cell(r)[:2] for r in rows} == {("zh", "choice")}
    test = generate_facts("test", 500, 0, languages=["en"])
    assert {r["language"] for r in test} == {"en"}


def test_ground_truths_are_scored_right_by_the_domains_their_data_source_routes_to():
    rows = (
        generate_facts("train", 200, 0)
        + generate_facts("test", 200, 0)
        + generate_facts("train", 100, 0, choice_answer="letter")
    )
    # the loaded layout: fields other than prompt/data_source/ground_truth go to `extra`
    loaded = [
        {
            "prompt": r["prompt"],
            "data_source": r["data_source"],
            "ground_truth": r["ground_truth"],
            "extra": {k: v for k, v in r.items() if k not in ("prompt", "data_source", "ground_truth")},
        }
        for r in rows
    ]
    with RewardManager(RewardConfig()) as rewards:
        rewards.check_rows(loaded, "facts")  # routes, and every ground truth fits its domain
        args = (
            [r["prompt"] for r in loaded],
            [r["data_source"] for r in loaded],
            [r["ground_truth"] for r in loaded],
            [r["extra"] for r in loaded],
        )
        right = rewards.score(args[0], [r["ground_truth"] for r in loaded], *args[1:])
        # the right letter for a text ground truth is right too; another option, by letter or text, is wrong
        letters = [
            next((k for k, v in r["extra"].get("options", {}).items() if r["ground_truth"] in (k, v)), None)
            for r in loaded
        ]
        by_letter = rewards.score(args[0], [k or r["ground_truth"] for k, r in zip(letters, loaded)], *args[1:])
        wrong_answers = [
            next((v for k, v in r["extra"]["options"].items() if k != letter), None) if letter else "Nowhere"
            for letter, r in zip(letters, loaded)
        ]
        wrong = rewards.score(args[0], wrong_answers, *args[1:])
    assert right.scores.tolist() == [1.0] * len(rows)
    assert by_letter.scores.tolist() == [1.0] * len(rows)
    assert wrong.scores.tolist() == [0.0] * len(rows)


def test_the_shipped_warm_start_has_a_token_for_every_character_of_its_tasks():
    from armor_core.models.loading import load_tokenizer, resolve_model_path
    from armor_plugins.tasks.arithmetic import generate_arithmetic

    tok = load_tokenizer("builtin:cross-domain-tiny")
    rows = (
        generate_facts("train", 3000, 0)
        + generate_facts("test", 192, 0)
        + generate_arithmetic("test", 300, 0, ops="+-*")
    )
    texts = [r["prompt"] for r in rows] + [str(r["ground_truth"]) for r in rows]
    assert not [t for t in texts if tok.unk_token_id in tok(t)["input_ids"]]
    assert tok.decode(tok("Kamel国旗的颜色？")["input_ids"], skip_special_tokens=True) == "Kamel国旗的颜色？"
    assert (
        sum(f.stat().st_size for f in resolve_model_path("builtin:cross-domain-tiny").iterdir()) < 8 * 2**20
    )  # a few MB


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"entities": 2}, "entities=2"),
        ({"languages": "fr"}, "languages='fr'"),
        ({"forms": []}, r"forms=\[\]"),
        ({"entitys": 10}, "unknown parameter"),
        ({"choice_answer": "number"}, "choice_answer='number'"),
    ],
)
def test_bad_parameters_are_named(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        generate_facts("train", 10, 0, **kwargs)
    with pytest.raises(ValueError, match="split 'dev'"):
        generate_facts("dev", 10, 0)


def test_mix_draws_each_task_in_proportion_and_shuffles_them_together():
    assert shares(10, [1, 1]) == [5, 5] and shares(10, [1, 1, 1]) == [4, 3, 3] and shares(7, [3, 1]) == [5, 2]
    rows = generate_mix("train", 300, 0, tasks={"arithmetic": {}, "facts": {"entities": 12}}, weights={"facts": 2})
    sources = Counter(r["data_source"] for r in rows)
    assert sources["arithmetic"] == 100 and sources["short_answer"] + sources["multiple_choice"] == 200
    assert rows == generate_mix(
        "train", 300, 0, tasks={"arithmetic": {}, "facts": {"entities": 12}}, weights={"facts": 2}
    )
    assert len({r["data_source"] for r in rows[:10]}) > 1  # shuffled together, not one task after the other
    with pytest.raises(ValueError, match="weights name"):
        generate_mix("train", 10, 0, tasks=["arithmetic"], weights={"facts": 1})
    with pytest.raises(ValueError, match="mix task itself"):
        generate_mix("train", 10, 0, tasks=["mix"])
