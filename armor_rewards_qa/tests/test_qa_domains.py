"""The multiple_choice and short_answer domains: scores and sub-scores, ground truths and options,
registration, and scoring through the RewardManager and ``armor reward``."""

import argparse
import json

import pytest
from armor_rewards_qa.domains import accepted_answers, choice_truth, multiple_choice_reward, short_answer_reward

import armor_rewards_qa
from armor_core.config.schema import RewardConfig
from armor_core.plugins import PluginManager
from armor_core.rewards.manager import RewardManager

PROMPT = "Which planet is known as the Red Planet?\nA. Venus\nB. Mars\nC. Jupiter\nD. Saturn"
PLANETS = {"options": {"A": "Venus", "B": "Mars", "C": "Jupiter", "D": "Saturn"}}
ZH_PROMPT = "下列哪些是哺乳动物？（多选）\nA. 鲸\nB. 鲨鱼\nC. 蝙蝠\nD. 企鹅"
ANIMALS = {"options": ["鲸", "鲨鱼", "蝙蝠", "企鹅"]}


def subs(**kw):
    base = {"correct": 0.0, "extracted": 1.0, "hedged": 0.0, "anchored": 1.0, "by_text": 0.0, "echoed": 0.0}
    return {**base, **{k: float(v) for k, v in kw.items()}}


@pytest.mark.parametrize(
    "response, ground_truth, extra, score, expected",
    [
        ("Answer: B", "B", PLANETS, 1.0, subs(correct=1)),
        ("Answer: C", "B", PLANETS, 0.0, subs()),
        ("The answer is Mars.", "B", PLANETS, 1.0, subs(correct=1, by_text=1)),
        ("I think it's A or B.", "B", PLANETS, 0.0, subs(hedged=1, anchored=0)),
        ("Answer: A, B, C, D", "B", PLANETS, 0.0, subs(hedged=1)),  # every letter
        ("Answer: A and B", "B", PLANETS, 0.0, subs(hedged=1)),  # two letters for a one-letter question
        ("B", "B", {}, 1.0, subs(correct=1, anchored=0)),  # letters from the prompt
        ("I'm not sure.", "B", PLANETS, 0.0, subs(extracted=0, anchored=0)),
        ("答案：A、C", ["A", "C"], ANIMALS, 1.0, subs(correct=1)),  # several right options: the exact set
        ("答案：AC", "AC", ANIMALS, 1.0, subs(correct=1)),
        ("答案：A", ["A", "C"], ANIMALS, 0.0, subs()),  # a subset is wrong, not hedged
        ("答案：ACD", ["A", "C"], ANIMALS, 0.0, subs()),  # a superset is wrong
        ("答案：ABCD", ["A", "C"], ANIMALS, 0.0, subs(hedged=1)),  # every letter where two are right
        ("答案：ABCD", "ABCD", ANIMALS, 1.0, subs(correct=1)),  # ... unless all four are
        ("答案：A或C", ["A", "C"], ANIMALS, 0.0, subs(hedged=1)),  # alternatives
        ("鲸和蝙蝠，答案是鲸和蝙蝠", "AC", ANIMALS, 1.0, subs(correct=1, by_text=1)),
    ],
)
def test_multiple_choice_scores(response, ground_truth, extra, score, expected):
    prompt = ZH_PROMPT if extra is ANIMALS else PROMPT
    result = multiple_choice_reward(prompt, response, ground_truth, extra)
    assert (result.score, result.sub_scores) == (score, expected)


def test_multiple_choice_parameters():
    assert multiple_choice_reward(PROMPT, "Answer: C", "B", PLANETS, correct_score=2.0, wrong_score=-1.0).score == -1.0
    assert multiple_choice_reward(PROMPT, "Answer: B", "B", PLANETS, correct_score=2.0, wrong_score=-1.0).score == 2.0
    assert multiple_choice_reward(PROMPT, "Mars", "B", PLANETS, allow_text=False).score == 0.0
    assert multiple_choice_reward(PROMPT, "I'd go with B", "B", PLANETS, strict=True).score == 0.0


@pytest.mark.parametrize(
    "ground_truth, expected",
    [
        ("B", {"B"}),
        (" (b) ", {"B"}),
        ("b.", {"B"}),
        (["A", "C"], {"A", "C"}),
        ("AC", {"A", "C"}),
        ("A, C", {"A", "C"}),
        ("A、C", {"A", "C"}),
        ('["A", "C"]', {"A", "C"}),
        ("Mars", {"B"}),
        (["mars", "C"], {"B", "C"}),
    ],
)
def test_choice_ground_truths(ground_truth, expected):
    assert choice_truth(ground_truth, PLANETS["options"], ["A", "B", "C", "D"]) == expected


@pytest.mark.parametrize(
    "ground_truth, message",
    [
        ("E", "E not among the options A, B, C, D"),
        ("Pluto", "'Pluto' is neither an option letter nor an option's text"),
        ([], "is empty"),
        ("", "is empty"),
    ],
)
def test_choice_ground_truth_that_does_not_fit_is_an_error(ground_truth, message):
    with pytest.raises(ValueError, match=message):
        multiple_choice_reward(PROMPT, "Answer: B", ground_truth, PLANETS)


def test_a_ground_truth_outside_the_prompts_letters_extends_them():
    # without extra options the letters are a guess: E is taken as a fifth option, not an error
    assert multiple_choice_reward(PROMPT, "Answer: E", "E", {}).score == 1.0


def test_short_answer_scores_and_sub_scores():
    r = short_answer_reward("Capital of France?", "The capital of France is Paris.", "Paris", {})
    assert (r.score, r.sub_scores) == (1.0, {"correct": 1.0, "hedged": 0.0, "f1": 1.0, "anchored": 0.0, "echoed": 0.0})
    r = short_answer_reward("Capital of France?", "Answer: Paris or Lyon", ["Paris", "Paris, France"], {})
    assert (r.score, r.sub_scores["hedged"], r.sub_scores["anchored"]) == (0.0, 1.0, 1.0)
    r = short_answer_reward("《红楼梦》的作者是谁？", "答案：清代的曹雪芹", "曹雪芹", {})
    assert r.score == 0.0 and r.sub_scores["f1"] == pytest.approx(2 / 3)
    # score_f1: the F1 between wrong_score and correct_score; a hedge still scores wrong_score
    assert short_answer_reward("q", "答案：清代的曹雪芹", "曹雪芹", {}, score_f1=True).score == pytest.approx(2 / 3)
    assert short_answer_reward("q", "北京或上海", "北京", {}, score_f1=True).score == 0.0
    assert short_answer_reward("q", "5000 m", "5 km", {}, units=True).score == 1.0
    assert short_answer_reward("q", "Paris", "Paris", {}, require_anchor=True).score == 0.0


@pytest.mark.parametrize(
    "ground_truth, expected",
    [
        ("Paris", ["Paris"]),
        (["Paris", "Paris, France"], ["Paris", "Paris, France"]),
        ('["北京", "北京市"]', ["北京", "北京市"]),
        (["Paris", " "], ["Paris"]),
        ("[not json", ["[not json"]),
        (1945, ["1945"]),
    ],
)
def test_accepted_answers(ground_truth, expected):
    assert accepted_answers(ground_truth) == expected


@pytest.mark.parametrize("ground_truth", [[], [""], "  "])
def test_no_accepted_answer_is_an_error(ground_truth):
    with pytest.raises(ValueError, match="holds no answer"):
        short_answer_reward("q", "Paris", ground_truth, {})


@pytest.fixture
def pm():
    manager = PluginManager(load_entrypoints=False, disabled=())
    manager.register(armor_rewards_qa, name="qa")
    return manager


def test_registered_inline_domains(pm):
    assert pm.names("reward_domain") == ["multiple_choice", "short_answer"]
    for name in ("multiple_choice", "short_answer"):
        domain = pm.get("reward_domain", name)
        assert domain.requires_ground_truth and domain.inline


def test_through_the_reward_manager_with_domain_kwargs(pm):
    cfg = RewardConfig(
        domain_kwargs={"short_answer": {"units": True, "rel_tol": 0.01}, "multiple_choice": {"strict": True}}
    )
    with RewardManager(cfg, pm) as rm:
        batch = rm.score(
            [PROMPT, "How far?", PROMPT],
            ["Answer: B", "3.1 miles", "B"],
            ["multiple_choice", "short_answer", "multiple_choice"],
            ["B", "5 km", "B"],
            [PLANETS, {}, PLANETS],
        )
    assert batch.scores.tolist() == [1.0, 1.0, 0.0]  # strict: a bare letter does not count
    assert batch.metrics["reward/failures"] == 0.0
    assert batch.sub_scores["short_answer/correct"][1] == 1.0


def test_the_single_example_cli_check(pm, monkeypatch, capsys):
    from armor_core.cli.reward import add_parser

    monkeypatch.setattr("armor_core.plugins._default", pm)

    def call(*argv):
        parser = argparse.ArgumentParser(prog="armor")
        add_parser(parser.add_subparsers())
        args = parser.parse_args(["reward", *argv])
        return args.func(args), capsys.readouterr()

    def run(*argv):
        rc, captured = call(*argv)
        return rc, json.loads(captured.out)

    rc, out = run("multiple_choice", "--prompt", PROMPT, "--response", "The answer is (B).", "--ground-truth", "B")
    assert rc == 0 and out["score"] == 1.0 and out["sub_scores"]["anchored"] == 1.0
    rc, out = run(
        "multiple_choice",
        "--prompt",
        "中国的首都是？",
        "--response",
        "答案是北京",
        "--ground-truth",
        "B",
        "--extra",
        json.dumps({"options": {"A": "上海", "B": "北京"}}, ensure_ascii=False),
    )
    assert rc == 0 and out["score"] == 1.0 and out["sub_scores"]["by_text"] == 1.0
    rc, out = run("short_answer", "--response", "5000 m", "--ground-truth", "5 km", "-p", "units=true")
    assert rc == 0 and out["score"] == 1.0
    rc, out = run("short_answer", "--response", "Answer: Paris, France", "--ground-truth", '["Paris", "Paris, France"]')
    assert rc == 0 and out["score"] == 1.0
    # a ground truth the domain refuses is a usage error, one line on stderr, as training refuses the row
    rc, (out, err) = call(
        "multiple_choice", "--response", "Answer: E", "--ground-truth", "E", "--extra", '{"options": ["x", "y"]}'
    )
    assert rc == 2 and out == "" and "not among the options A, B" in err and len(err.strip().splitlines()) == 1
