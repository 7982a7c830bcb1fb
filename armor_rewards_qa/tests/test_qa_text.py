"""Answer normalisation and token F1 in English and Chinese, against hand-computed values."""

import pytest
from armor_rewards_qa.text import normalize, token_f1, tokens


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The Pacific Ocean!", "pacific ocean"),  # case, article, punctuation
        ("  an   apple  ", "apple"),  # whitespace, article
        ("Stratford-upon-Avon", "stratford upon avon"),  # punctuation becomes a space
        ("5.5 km", "5.5 km"),  # a decimal point stays
        ("1,000 people", "1000 people"),  # a thousands separator goes
        ("Ｈ２Ｏ", "h2o"),  # full-width to half-width
        ("H₂O", "h2o"),  # subscript digit
        ("北 京 市。", "北京市"),  # spaces between CJK characters, Chinese full stop
        ("《红楼梦》", "红楼梦"),  # book-title marks
        ("“北京”，", "北京"),  # curly quotes, full-width comma
        ("答案：Ｂ", "答案b"),  # full-width colon and letter
        ("...", ""),
    ],
)
def test_normalize(text, expected):
    assert normalize(text) == expected


def test_tokens_are_latin_words_and_single_chinese_characters():
    assert tokens("The capital is Paris.") == ["capital", "is", "paris"]
    assert tokens("曹雪芹（清代）") == ["曹", "雪", "芹", "清", "代"]
    assert tokens("H2O是水") == ["h2o", "是", "水"]


def test_token_f1_hand_computed():
    # "cat sat" against "cat sat down": precision 2/2, recall 2/3, F1 = 2 * 1 * 2/3 / (1 + 2/3) = 0.8
    assert token_f1(tokens("the cat sat"), tokens("cat sat down")) == pytest.approx(0.8)
    # character level: 清代的曹雪芹 (6) against 曹雪芹 (3): 3 shared, P = 1/2, R = 1, F1 = 2/3
    assert token_f1(tokens("清代的曹雪芹"), tokens("曹雪芹")) == pytest.approx(2 / 3)
    # a multiset: "a a b" (after articles: "b") -- use words that are not articles
    assert token_f1(["x", "x", "y"], ["x", "y", "y"]) == pytest.approx(2 / 3)  # shared {x, y}: P = R = 2/3
    assert token_f1([], []) == 1.0 and token_f1(["x"], []) == 0.0 and token_f1(["x"], ["y"]) == 0.0
