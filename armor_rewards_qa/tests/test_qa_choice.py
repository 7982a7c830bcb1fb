"""The anchoring rules of ``multiple_choice`` (choice.py), one behaviour per case, English and Chinese."""

import pytest
from armor_rewards_qa.choice import letters_in_prompt, parse_options, read_choice

ABCD = ["A", "B", "C", "D"]
PLANETS = {"A": "Venus", "B": "Mars", "C": "Jupiter", "D": "Saturn"}
CITIES = {"A": "上海", "B": "北京", "C": "广州", "D": "深圳"}


def read(response, options=PLANETS, prompt="", **kw):
    c = read_choice(response, sorted(options) or ABCD, options, prompt, **kw)
    return "".join(c.letters), c.alternatives, c.source, c.by_text


@pytest.mark.parametrize(
    "response, letters, source",
    [
        # answer statements, English
        ("Answer: B", "B", "statement"),
        ("**Answer:** (B)", "B", "statement"),
        ("The correct option is B.", "B", "statement"),
        ("Final answer: \\boxed{B}", "B", "statement"),
        ("My choice is B.", "B", "statement"),
        ("Answer: (b)", "B", "statement"),  # lower case, bracketed
        ("Answer: I think B", "B", "statement"),
        # answer statements, Chinese
        ("答案：B", "B", "statement"),
        ("答案：Ｂ", "B", "statement"),
        ("答案为（B）", "B", "statement"),
        ("正确答案是 B", "B", "statement"),
        ("选B", "B", "statement"),
        ("故选 B。", "B", "statement"),
        ("答：B", "B", "statement"),
        ("应选B项。", "B", "statement"),
        ("正确选项为B。", "B", "statement"),
        # weaker statements
        ("I'd go with B.", "B", "weak"),
        ("I choose (B).", "B", "weak"),
        ("B is the correct answer.", "B", "weak"),
        ("B选项正确。", "B", "weak"),
        ("it's B", "B", "weak"),
        # the end of the response
        ("B", "B", "end"),
        ("**B**", "B", "end"),
        ("(B) Mars", "B", "end"),
        ("B. Mars", "B", "end"),
        ("Mars is red, so B.", "B", "end"),
        ("Mars is red. Option B.", "B", "end"),
        ("选项B", "B", "end"),
    ],
)
def test_where_the_letter_is_read(response, letters, source):
    got = read(response)
    assert (got[0], got[2]) == (letters, source)


@pytest.mark.parametrize(
    "response, letters",
    [
        ("The answer is C. Wait, no: Mars is red, so the answer is B.", "B"),  # the last statement wins
        ("我觉得是A，不对，应该选B。", "B"),
        (
            "Answer: B\n\nExplanation: A is incorrect; C is correct only for gas giants.",
            "B",
        ),  # a statement beats a weaker one after it
        ("The answer is not A. Mars is red, so B.", "B"),  # negated statement passed over
        ("不选A，因为上海不是首都。选B。", "B"),
        ("答案不是A，是B", "B"),
        ("If the answer were A, Venus would be red. The answer is B.", "B"),  # hypothetical statement passed over
        ("如果选A就错了。正确答案：B", "B"),
        ("Answer: E", ""),  # not an option
        ("The answer is Because.", ""),  # a word is not a letter
        ("Vitamin B", ""),  # a bare letter needs a cue at the end
        ("I'm not sure.", ""),
        ("The answer is a planet.", ""),  # a lower-case article is not option A
    ],
)
def test_which_statement_counts(response, letters):
    assert read(response)[0] == letters


@pytest.mark.parametrize(
    "response, letters, options",
    [
        ("The answer is Mars.", "B", PLANETS),
        ("Mars", "B", PLANETS),
        ("It is the one with iron oxide: Mars.", "B", PLANETS),
        ("The answer is Mars, not Venus.", "B", PLANETS),
        ("答案是北京。", "B", CITIES),
        ("作者是北京。", "B", CITIES),
        ("The answer is not Venus.", "", PLANETS),
    ],
)
def test_an_option_quoted_by_its_text(response, letters, options):
    got = read(response, options)
    assert got[0] == letters and got[3] == bool(letters)
    assert (
        read(response, options, allow_text=False)[0] in ("", letters)
        and not read(response, options, allow_text=False)[3]
    )


@pytest.mark.parametrize(
    "response, letters, alternatives",
    [
        ("I think it's A or B.", "AB", True),
        ("Answer: B or C", "BC", True),
        ("答案是B或C", "BC", True),
        ("A或B都有可能。", "AB", True),
        ("The correct answer is either B or C.", "BC", True),
        ("Answer: Mars or Venus", "BA", True),
        ("A. Venus\nB. Mars\nC. Jupiter\nD. Saturn", "ABCD", True),  # every option listed, none chosen
        ("Which planet is red? (A) Venus (B) Mars (C) Jupiter (D) Saturn", "ABCD", True),  # every option's text named
        ("Answer: A and C", "AC", False),  # several letters, not alternatives
        ("答案为A、C。", "AC", False),
        ("Answer: AC", "AC", False),
        ("答案：ABCD", "ABCD", False),
    ],
)
def test_several_letters(response, letters, alternatives):
    got = read(response)
    assert (got[0], got[1]) == (letters, alternatives)


def test_a_statement_copied_from_the_prompt_is_passed_over():
    shot = "Let's think step by step about this question carefully. So the Answer: B"
    prompt = f"Example. {shot}\n\nWhich planet is red?"
    copied = read_choice(shot, ABCD, PLANETS, prompt)
    assert copied.letters == () and copied.echoed  # nothing else: no answer (not even the end rule)
    own = read_choice(shot + "\nMars is red, so the answer is C.", ABCD, PLANETS, prompt)
    assert own.letters == ("C",) and not own.echoed  # a later statement of its own counts
    short = read_choice("Answer: B", ABCD, PLANETS, "Reply as 'Answer: B'.")
    assert short.letters == ("B",) and not short.echoed  # under 64 characters: not a copy


def test_strict_reads_answer_statements_only():
    assert read("I'd go with B.", strict=True)[0] == ""
    assert read("B", strict=True)[0] == ""
    assert read("Answer: B", strict=True)[0] == "B"


def test_options_from_extra_and_from_the_prompt():
    assert parse_options({"a": "x", "B": "y"}) == {"A": "x", "B": "y"}
    assert parse_options(["A) Charlotte Brontë", "B) Jane Austen", "Mary Shelley"]) == {
        "A": "Charlotte Brontë",
        "B": "Jane Austen",
        "C": "Mary Shelley",
    }
    assert parse_options('["Venus", "Mars"]') == {"A": "Venus", "B": "Mars"}
    with pytest.raises(ValueError, match="single letters"):
        parse_options({"AB": "x"})
    with pytest.raises(ValueError, match="mapping"):
        parse_options(3)
    assert letters_in_prompt("Q?\nA. x\nB. y\nC. z") == ["A", "B", "C"]
    assert letters_in_prompt("Q? (A) Ag (B) Au (C) Gd") == ["A", "B", "C"]
    assert letters_in_prompt("水的化学式是？A. H2O B. CO2") == ["A", "B"]
    assert letters_in_prompt("What is 2+2?") == []


@pytest.mark.parametrize(
    "response",
    [
        "A or B, " * 5000,
        "answer is " * 5000,
        "A, " * 20000,
        "选" * 30000,
        "Mars Venus " * 5000,
        "word " * 200_000 + "Answer: B",
    ],
)
def test_long_adversarial_responses_stay_fast(response):
    import time

    start = time.perf_counter()
    read(response)
    assert time.perf_counter() - start < 5.0  # about 1 s at most on one core; quadratic versions took minutes
