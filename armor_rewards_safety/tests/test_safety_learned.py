"""The learned refusal model (learned.py), its trainer (train.py) and how the domains use it.

The built-in model was trained on XSTest completions, which are not shipped; these tests use the
shipped weights, hand-written responses, and small synthetic training sets."""

import json
import time
from pathlib import Path

import numpy as np
import pytest
from armor_rewards_safety.domains import refusal_reward, safety_reward
from armor_rewards_safety.learned import BUILTIN, FORMAT, RefusalModel, load_model
from armor_rewards_safety.refusal import classify_refusal
from armor_rewards_safety.ruleset import load_rules
from armor_rewards_safety.sources import LabelledResponse
from armor_rewards_safety.train import fit_logistic, train

RULES = load_rules()
MODEL = load_model()
CASES = [
    json.loads(line)
    for line in (Path(__file__).parent / "cases" / "refusal.jsonl").read_text(encoding="utf-8").splitlines()
    if line.strip()
]


def test_builtin_model_loads_with_its_provenance():
    data = json.loads(BUILTIN.read_text(encoding="utf-8"))
    assert data["format"] == FORMAT and data["trained_on"]["split"] == "tune"
    assert 0 < MODEL.threshold < 1 and len(MODEL.ngrams) > 1000
    assert MODEL.signals["rule_refusal"] > 0 > MODEL.signals["rule_compliance"]


def test_every_hand_written_case_keeps_its_label_with_the_model():
    # the model only reviews what the rules call compliance: no hand-written refusal, partial refusal or
    # plain answer (English or Chinese) changes label
    wrong = [
        (c["label"], c["response"][:60])
        for c in CASES
        if classify_refusal(c["response"], RULES, model=MODEL).label != c["label"]
    ]
    assert not wrong


@pytest.mark.parametrize(
    "text",
    [
        "To bake sourdough bread, mix 500 g flour with 350 g water and 100 g starter, rest it for an hour, add "
        "salt, fold every 30 minutes for two hours, shape, proof overnight in the fridge and bake at 250 C for 40 "
        "minutes.",
        "To kill a Python process, find its PID with `ps aux | grep python` and run `kill PID`; if it does not stop, "
        "`kill -9 PID` forces it.",
        "The French Revolution began in 1789 with the storming of the Bastille. It abolished the monarchy, and the "
        "king was executed in 1793; historians still debate whether the Terror that followed was justified.",
    ],
)
def test_plain_answers_stay_answers(text):
    verdict = classify_refusal(text, RULES, model=MODEL)
    assert verdict.label == "compliance" and verdict.probability < MODEL.threshold


def test_a_model_can_only_add_refusals_and_skips_chinese():
    eager = RefusalModel(bias=10.0, signals={}, ngrams={})  # calls everything refused
    shy = RefusalModel(bias=-10.0, signals={}, ngrams={})  # calls nothing refused
    assert classify_refusal("The capital of France is Paris.", RULES, model=eager).label == "refusal"
    assert classify_refusal("I can't help with that.", RULES, model=shy).label == "refusal"
    zh = classify_refusal("法国的首都是巴黎。", RULES, model=eager)
    assert zh.label == "compliance" and zh.probability is None
    # flagged content with a sign of compliance is a partial refusal, as with the rules
    answer = (
        "Here is how to do it: preheat the oven to 200 C, season the chicken, and roast it for 45 minutes until done."
    )
    assert classify_refusal(answer, RULES, model=eager).label == "partial"


def test_domains_take_a_model_file_or_none(tmp_path):
    mine = tmp_path / "mine.json"
    mine.write_text(
        json.dumps({"format": FORMAT, "threshold": 0.5, "bias": -5.0, "signals": {}, "ngrams": {"zebra": 10.0}})
    )
    response = "A zebra crossing is a pedestrian crossing marked with white stripes."
    assert refusal_reward("q", response, None, {}, learned_model=str(mine)).score == 1.0
    assert refusal_reward("q", response, None, {}, learned_model=None).score == 0.0
    assert safety_reward("q", response, "safe", {}, learned_model=str(mine)).sub_scores["over_refusal"] == 1.0


def test_bad_model_files_are_errors_naming_the_file(tmp_path):
    with pytest.raises(ValueError, match="no such file; use 'builtin', null"):
        load_model(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match=r"bad\.json: not a refusal model \(format 'other'\)"):
        load_model(str(bad))
    with pytest.raises(ValueError, match="malformed refusal model"):
        RefusalModel.from_dict({"format": FORMAT, "threshold": 0.5})
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        RefusalModel.from_dict({"format": FORMAT, "threshold": 1.0, "bias": 0, "signals": {}, "ngrams": {}})


def test_fit_logistic_matches_a_separable_problem():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = (X @ np.array([2.0, -1.0, 0.0]) + 0.5 > 0).astype(float)
    w, b = fit_logistic(X, y, l2=1e-3)
    accuracy = np.mean(((X @ w + b) > 0) == (y > 0))
    assert accuracy > 0.97 and w[0] > 0 > w[1] and abs(w[2]) < abs(w[1])


def _rows(n):
    lecture = "It is wrong to harm animals, and kindness toward every creature matters; please treat {} gently."
    answer = "Feed the {} twice a day, give it fresh water, and take it to the vet once a year for a check-up."
    pets = ["dog", "cat", "rabbit", "parrot", "hamster", "horse"]
    return [
        LabelledResponse(
            "test",
            "pets",
            f"r{i}",
            f"q{i}",
            (lecture if i % 2 else answer).format(pets[i % len(pets)]),
            bool(i % 2),
            "tune",
        )  # fmt: skip
        for i in range(n)
    ]


def test_train_learns_refusals_the_rules_miss_and_is_deterministic():
    rows = _rows(40)
    data = train(rows, RULES, min_rows=3)
    assert data == train(rows, RULES, min_rows=3)  # same data, same file
    assert data["trained_on"]["rows"] == 40 and data["trained_on"]["refused"] == 20
    model = RefusalModel.from_dict(json.loads(json.dumps(data)))
    unseen = "It is wrong to harm animals, and kindness toward every creature matters; please treat the goat gently."
    assert classify_refusal(unseen, RULES).label == "compliance"
    assert classify_refusal(unseen, RULES, model=model).label == "refusal"
    assert (
        classify_refusal("Feed the goat twice a day and give it fresh water.", RULES, model=model).label == "compliance"
    )


def test_model_keeps_matching_linear_on_long_input():
    text = "it is important to remember " * 5000 + "a" * 50000
    start = time.perf_counter()
    classify_refusal(text, RULES, model=MODEL)
    assert time.perf_counter() - start < 2.0
