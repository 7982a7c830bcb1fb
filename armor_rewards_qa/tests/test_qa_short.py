"""The anchoring, matching and hedging rules of ``short_answer`` (short.py), English and Chinese."""

import pytest
from armor_rewards_qa.short import match, read_answer


@pytest.mark.parametrize(
    "response, span, candidate, anchored",
    [
        ("Answer: Paris", "Paris", "Paris", True),
        ("Final answer: William Shakespeare", "William Shakespeare", "William Shakespeare", True),
        ("The answer is London. Paris is nice too.", "London", "London", True),  # a statement's sentence
        ("Answer: London\nOn reflection, the answer is Paris.", "Paris", "Paris", True),  # the last statement wins
        ("\\boxed{Paris}", "Paris", "Paris", True),
        ("答案：北京", "北京", "北京", True),
        ("答案是：北京。", "北京", "北京", True),
        ("答：北京", "北京", "北京", True),
        ("Answer: 5.5 km. It is far.", "5.5 km", "5.5 km", True),  # a decimal point ends no sentence
        ("Answer: Washington, D.C.", "Washington, D.C.", "Washington, D.C", True),
        # no statement: the last sentence of the last line, reduced
        ("The capital of France is Paris.", "The capital of France is Paris.", "Paris", False),
        ("France's capital city is Paris, which is also its largest city.", None, "Paris", False),  # appositive dropped
        ("Sodium's symbol is Na (from the Latin natrium).", None, "Na", False),  # parenthetical dropped
        ("I believe it's Paris.", None, "Paris", False),
        ("Hamlet was written by William Shakespeare.", None, "William Shakespeare", False),  # passive agent
        ("12 x 12 = 144", None, "144", False),
        ("中国的首都是北京。", None, "北京", False),
        ("首都为北京", None, "北京", False),
        ("鲁迅原名周树人。", None, "周树人", False),
        ("可是北京", None, "可是北京", False),  # 可是 ("but") is no copula
        ("Let me think.\nParis is lovely.\n\n**Paris**", "Paris", "Paris", False),
    ],
)
def test_where_the_answer_is(response, span, candidate, anchored):
    a = read_answer(response)
    assert (a.candidate, a.anchored) == (candidate, anchored)
    if span is not None:
        assert a.span == span


def test_require_anchor_and_echo():
    assert read_answer("Paris", require_anchor=True).candidate == ""
    shot = "Let us think step by step about this question carefully. The answer is Rome"
    a = read_answer(shot, prompt=f"Example: {shot}.\nWhat is the capital of France?")
    assert a.candidate == "" and a.echoed  # the only statement copies the prompt
    assert (
        read_answer("The answer is Rome", prompt="Say 'The answer is Rome'.").candidate == "Rome"
    )  # under 64 characters


def ok(response, accepted, **kw):
    m = match(read_answer(response), accepted if isinstance(accepted, list) else [accepted], **kw)
    return m.correct, m.hedged


@pytest.mark.parametrize(
    "response, accepted, kw, correct",
    [
        ("paris.", "Paris", {}, True),
        ("The Pacific Ocean", ["the Pacific Ocean"], {}, True),  # articles and case
        ("Pacific", ["the Pacific Ocean", "Pacific"], {}, True),  # an alias
        ("NA", "Na", {}, True),
        ("Ｈ２Ｏ", "H2O", {}, True),
        ("水的化学式是H₂O。", "H2O", {}, True),
        ("北京市", ["北京", "北京市"], {}, True),
        ("答案：“北京”", "北京", {}, True),
        ("Paris, Lyon, Marseille", "Paris", {}, False),  # a list is not the answer
        ("144.0", "144", {}, True),
        ("1,000", "1000", {}, True),
        ("World War II ended in 1945.", "1945", {}, True),  # the one number in the sentence
        ("It ended in 1944.", "1945", {}, False),
        ("1944 or 1945", "1945", {}, False),
        ("5000 m", "5 km", {"units": True}, True),
        ("5000 m", "5 km", {}, False),  # conversion needs units: true
        ("5 kilometres", "5 km", {}, True),
        ("The trail is about 5 kilometers long.", "5 km", {"units": True}, True),
        ("3.1 miles", "5 km", {"units": True, "rel_tol": 0.01}, True),  # 4988.97 m: 0.2% off
        ("3.1 miles", "5 km", {"units": True}, False),
        ("100 °C", "212 °F", {"units": True}, True),
        ("8848.86米", "8848米", {"units": True, "rel_tol": 0.001}, True),
        ("8.848千米", "8848米", {"units": True}, True),
        ("365天", "365", {}, True),
        ("平年有365天。", "365", {}, True),
        ("答案：三百六十五天", "365", {}, True),
        ("约2189万人", "2100万", {"rel_tol": 0.05}, True),
        ("1.5亿", "2100万", {"rel_tol": 0.05}, False),
    ],
)
def test_matching(response, accepted, kw, correct):
    assert ok(response, accepted, **kw)[0] is correct


@pytest.mark.parametrize(
    "response, accepted, hedged",
    [
        ("Paris or Lyon", "Paris", True),
        ("It was either Shakespeare or Marlowe.", "Shakespeare", True),
        ("Answer: 5 km or 6 km", "5 km", True),
        ("北京或上海", "北京", True),
        ("可能是北京，也可能是南京。", "北京", True),
        ("长江或黄河", "长江", True),
        ("salt or pepper", "salt or pepper", False),  # the accepted answer has the connective itself
        ("或许是北京", "北京", False),  # 或许 is "perhaps", not "or"
    ],
)
def test_hedging(response, accepted, hedged):
    assert ok(response, accepted) == (not hedged and response in ("salt or pepper", "或许是北京"), hedged)


def test_f1_is_the_best_over_the_accepted_answers():
    m = match(read_answer("《红楼梦》的作者是清代的曹雪芹。"), ["曹雪芹", "曹霑"])
    assert not m.correct and m.f1 == pytest.approx(2 / 3)  # 清代的曹雪芹 against 曹雪芹: P 1/2, R 1
    m = match(read_answer("The answer is William Shakespeare Jr."), ["William Shakespeare"])
    assert m.f1 == pytest.approx(0.8)  # 2 of 3 tokens: P 2/3, R 1


@pytest.mark.parametrize(
    "response",
    [
        "word " * 200_000 + "Paris",
        "Answer: " + "a" * 1_000_000,
        "(" * 200_000 + ")" * 200_000,
        "answer: " * 50_000,
        "1 " * 50_000,
        "ab written by " * 50_000,
    ],
)
def test_long_adversarial_responses_stay_fast(response):
    import time

    start = time.perf_counter()
    match(read_answer(response), ["Paris"])
    assert time.perf_counter() - start < 5.0  # a tenth of a second on one core
