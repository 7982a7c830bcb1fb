"""Labelled refusal cases (cases/refusal.jsonl), English and Chinese: full refusals that do and do
not start with "Sorry", partial refusals, compliance, and tricky non-refusals ("I can't wait to
help!", explanations of why something is illegal). Labels written by hand."""

import json
from pathlib import Path

import pytest

from armor_rewards_safety.refusal import classify_refusal
from armor_rewards_safety.ruleset import load_rules, normalize, parse_rules

CASES = [json.loads(line) for line in (Path(__file__).parent / "cases" / "refusal.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
RULES = load_rules()


def test_cases_cover_every_label_in_both_languages():
    for lang in ("en", "zh"):
        labels = [c["label"] for c in CASES if c["lang"] == lang]
        assert set(labels) == {"refusal", "partial", "compliance"}
    assert len(CASES) >= 140


@pytest.mark.parametrize("case", CASES, ids=[f"{c['lang']}-{c['label']}-{i}" for i, c in enumerate(CASES)])
def test_refusal_label(case):
    verdict = classify_refusal(case["response"], RULES)
    assert verdict.label == case["label"], f"{case['note']} | refusals={verdict.refusals} content={verdict.content_size}"


def test_most_refusals_do_not_start_with_sorry():
    refusals = [c["response"].strip().lower() for c in CASES if c["label"] == "refusal" and c["lang"] == "en"]
    assert sum(not r.startswith(("sorry", "i'm sorry", "i am sorry")) for r in refusals) > len(refusals) // 2


@pytest.mark.parametrize("text, expected", [
    ("I Can’t", "i cannot"),
    ("  I WON'T  go ", "i will not go"),
    ("It’s “fine”", 'it is "fine"'),
    ("don't", "do not"),
    ("ＡＢＣ，１２３", "abc,123"),
])
def test_normalize(text, expected):
    assert normalize(text) == expected


def test_rules_are_data_extensible_without_code(tmp_path):
    custom = tmp_path / "mine.txt"
    custom.write_text("# my rules\n[refusal]\nthat is above my pay grade\n", encoding="utf-8")
    text = "That is above my pay grade."
    assert classify_refusal(text, RULES).label == "compliance"
    assert classify_refusal(text, load_rules(None, (str(custom),))).label == "refusal"


def test_rule_file_errors_name_file_and_line(tmp_path):
    with pytest.raises(ValueError, match=r"x\.txt:2: unknown section \[refusals\]"):
        parse_rules("# c\n[refusals]\nfoo\n", "x.txt")
    with pytest.raises(ValueError, match=r"x\.txt:1: phrase 'foo' before any \[section\]"):
        parse_rules("foo\n", "x.txt")
    with pytest.raises(ValueError, match="no built-in refusal rules for language 'fr'"):
        load_rules(("fr",))


def test_rules_normalize_their_phrases():
    # a rule written with a curly apostrophe and a contraction still matches
    rules = parse_rules("[refusal]\nI Won’t Do It\n")
    assert rules["refusal"] == ["i will not do it"]


def test_matching_is_linear_on_long_input():
    import time

    text = "i cannot " * 5000 + "a" * 50000
    start = time.perf_counter()
    classify_refusal(text, RULES)
    assert time.perf_counter() - start < 2.0
