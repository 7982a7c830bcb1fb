"""The built-in ``format`` and ``length`` reward domains, several domains on one row, and ground
truths refused at load time (``validate_ground_truth``, ``data.skip_invalid``)."""

from __future__ import annotations

import json
import time

import pytest

import armor_plugins.rewards.format as format_plugin
import armor_plugins.rewards.length as length_plugin
import armor_rewards_math
import armor_rewards_qa
from armor_core.config.schema import ConfigError, RewardConfig, load_config
from armor_core.ops.lengths import overlong_penalty
from armor_core.plugins import PluginManager
from armor_core.rewards.manager import RewardManager
from armor_plugins.rewards.format import format_reward
from armor_plugins.rewards.length import length_reward


@pytest.fixture(scope="module")
def pm():
    manager = PluginManager(load_entrypoints=False, disabled=())
    for plugin in (format_plugin, length_plugin, armor_rewards_math, armor_rewards_qa):
        manager.register(plugin)
    return manager


def fmt(response, **params):
    out = format_reward("q", response, None, {}, **params)
    return out.score, out.sub_scores


# -- format ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, parts",
    [
        ("<think>2+2 is 4</think><answer>4</answer>", (1, 1, 1, 1)),
        ("  <think>\nadd\n</think>\n\n<answer>4</answer>\n", (1, 1, 1, 1)),  # whitespace around blocks is fine
        ("<think></think><answer>4</answer>", (0, 1, 0, 0)),  # an empty block is no reasoning
        ("<think>x</think>", (1, 0, 0, 0)),
        ("<answer>4</answer><think>x</think>", (1, 1, 0, 0)),  # wrong order
        ("Sure! <think>x</think><answer>4</answer>", (1, 1, 1, 0)),  # text outside the blocks
        ("<think>x</think><answer>4</answer> Hope that helps", (1, 1, 1, 0)),
        ("<think>x <answer>3</answer></think><answer>4</answer>", (1, 0, 0, 0)),  # a second answer inside the reasoning
        ("<think>x</think><think>y</think><answer>4</answer>", (0, 1, 0, 0)),  # opened twice
        ("<think>x<answer>4</answer>", (0, 1, 0, 0)),  # never closed
    ],
)
def test_think_answer_parts(response, parts):
    score, subs = fmt(response)
    assert (subs["think"], subs["answer"], subs["order"], subs["clean"]) == parts
    assert score == float(all(parts))


def test_partial_scores_the_fraction_of_parts():
    # think, answer and order hold, clean does not: 3 of 4
    assert fmt("Sure! <think>x</think><answer>4</answer>", partial=True)[0] == 0.75
    assert fmt("no tags at all", partial=True)[0] == 0.0


@pytest.mark.parametrize(
    "response, parts",
    [
        (r"so the answer is $\boxed{4}$.", (1, 1, 1)),
        (r"\boxed{\frac{1}{2}}", (1, 1, 1)),  # nested braces
        (r"\boxed{\{1, 2\}} **", (1, 1, 1)),  # escaped braces are text
        (r"\boxed{1} or \boxed{2}", (1, 0, 1)),  # two answers offered
        (r"\boxed{4} and then I kept thinking", (1, 1, 0)),
        (r"\boxed{ }", (0, 1, 0)),  # empty
        (r"\boxed{4", (0, 1, 0)),  # never closed
        ("the answer is 4", (0, 0, 0)),
    ],
)
def test_boxed_parts(response, parts):
    score, subs = fmt(response, preset="boxed")
    assert (subs["boxed"], subs["single"], subs["final"]) == parts
    assert score == float(all(parts))


def test_boxed_is_linear_in_the_response():
    # 40,000 unclosed boxes: a closing-brace scan per box would take ~10^9 steps
    start = time.perf_counter()
    score, _ = fmt("\\boxed{" * 40_000, preset="boxed")
    assert score == 0.0 and time.perf_counter() - start < 2.0


def test_pattern_scores_the_whole_match_and_reports_named_groups():
    pattern = r"Reasoning: (?P<reasoning>.+)\nAnswer: (?P<answer>\d+)"
    assert fmt("Reasoning: 2 and 2\nAnswer: 4\n", pattern=pattern) == (
        1.0,
        {"match": 1.0, "found": 1.0, "reasoning": 1.0, "answer": 1.0},
    )
    # found inside extra text: the parts are reported, the score needs the whole response
    assert fmt("Hi. Reasoning: r\nAnswer: 4 bye", pattern=pattern) == (
        0.0,
        {"match": 0.0, "found": 1.0, "reasoning": 1.0, "answer": 1.0},
    )
    assert fmt("Answer: 4", pattern=pattern) == (0.0, {"match": 0.0, "found": 0.0, "reasoning": 0.0, "answer": 0.0})


@pytest.mark.parametrize(
    "params, message",
    [
        ({"preset": "think-answer"}, r"unknown preset 'think-answer'; presets: boxed, think_answer"),
        ({"preset": "boxed", "pattern": "x"}, "a preset or a pattern, not both"),
        ({"pattern": "(unclosed"}, "not a valid regular expression"),
        ({"pattern": "(?P<score>.+)"}, "group name 'score' is taken"),
    ],
)
def test_a_bad_format_configuration_is_an_error_at_start(pm, params, message):
    with pytest.raises(ValueError, match=message):
        fmt("x", **params)
    with pytest.raises(ConfigError, match=message):  # binding the run's domains, before any row is scored
        RewardManager(RewardConfig(domain_kwargs={"format": params}), pm)


# -- length ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("length, expected", [(0, 0.0), (80, 0.0), (81, -0.05), (90, -0.5), (100, -1.0), (101, -1.0)])
def test_overlong_penalty_dapo(length, expected):
    # L_max = 100, L_cache = 20: (80 - length) / 20 inside the buffer (DAPO eq. 13)
    assert overlong_penalty(length, 100, 20) == pytest.approx(expected)


def length_of(n, **params):
    out = length_reward("q", "x" * n, None, {"response_length": n}, **params)
    return out.score, out.sub_scores


@pytest.mark.parametrize(
    "n, score",
    [
        (0, 0.0),
        (5, 0.5),
        (10, 1.0),
        (20, 1.0),  # below the band: n / target_min
        (30, 0.5),
        (40, 0.0),
        (60, 0.0),  # above: 0 at twice target_max
    ],
)
def test_band_falls_linearly_outside(n, score):
    assert length_of(n, target_min=10, target_max=20) == (score, {"length": n, "band": score})


def test_band_with_a_falloff_and_one_open_end():
    assert length_of(24, target_max=20, falloff=8)[0] == 0.5  # 1 - 4/8
    assert length_of(3, target_min=10, falloff=4)[0] == 0.0  # 7 below, past the falloff
    assert length_of(1000, target_min=10)[0] == 1.0  # no upper edge


def test_overlong_and_band_add_up_floored_at_zero():
    # band: 1 - (90 - 50) / 50 = 0.2; overlong (L_max 100, buffer 20): (80 - 90) / 20 = -0.5; 0.2 - 0.5 < 0
    assert length_of(90, target_max=50, overlong_max_length=100, overlong_buffer=20) == (
        0.0,
        {"length": 90, "band": pytest.approx(0.2), "overlong": -0.5},
    )
    # overlong alone: 1 - 0.25
    assert length_of(85, overlong_max_length=100, overlong_buffer=20)[0] == 0.75


def test_length_counts_tokens_or_chars():
    out = length_reward("q", "abcdef", None, {"response_length": 2}, target_max=4)
    assert out.sub_scores["length"] == 2 and out.score == 1.0
    assert length_reward("q", "abcdef", None, {}, target_max=4, unit="chars").score == 0.5
    with pytest.raises(ValueError, match="response_length"):
        length_reward("q", "abcdef", None, {}, target_max=4)


def test_length_without_anything_to_score_is_an_error_at_start(pm):
    with pytest.raises(ConfigError, match="length: nothing to score"):
        RewardManager(RewardConfig(domain_map={"t": {"length": 1.0}}), pm)
    with pytest.raises(ConfigError, match="target_min=30 is above target_max=20"):
        RewardManager(RewardConfig(domain_kwargs={"length": {"target_min": 30, "target_max": 20}}), pm)


def test_the_math_packs_overlong_parameters_use_the_same_penalty():
    from armor_rewards_math.domains import math_reward
    from armor_rewards_math.domains import overlong_penalty as old_name

    assert old_name is overlong_penalty
    params = {"overlong_max_length": 100, "overlong_buffer": 20}
    math_out = math_reward("q", r"\boxed{4}", "4", {"response_length": 90}, **params)
    length_out = length_reward("q", r"\boxed{4}", None, {"response_length": 90}, **params)
    assert math_out.sub_scores["overlong"] == length_out.sub_scores["overlong"] == -0.5
    assert math_out.score == 1.0 - 0.5


# -- several domains on one row ---------------------------------------------------------------------


def test_domain_map_scores_a_row_with_weighted_format_and_length(pm):
    cfg = RewardConfig(
        domain_map={"gsm8k": {"gsm8k": 1.0, "format": 0.1, "length": 0.1}},
        domain_kwargs={"format": {"preset": "boxed"}, "length": {"target_max": 20, "unit": "chars"}},
    )
    with RewardManager(cfg, pm) as rm:
        responses = [
            r"\boxed{4}",  # right, boxed, short: 1 + 0.1 + 0.1
            r"so \boxed{5}",  # wrong, boxed, short: 0 + 0.1 + 0.1
            "4" + " " * 29,
        ]  # right (last number), no box, 30 chars: band 1 - 10/20 = 0.5 -> 1 + 0 + 0.05
        batch = rm.score(["2+2?"] * 3, responses, ["gsm8k"] * 3, ["4"] * 3)
    assert batch.scores.tolist() == pytest.approx([1.2, 0.2, 1.05])
    assert batch.sub_scores["format/score"].tolist() == [1.0, 1.0, 0.0]
    assert batch.sub_scores["length/band"].tolist() == pytest.approx([1.0, 1.0, 0.5])
    m = batch.metrics
    assert m["reward/gsm8k/score"] == pytest.approx(2 / 3) and m["reward/format/boxed"] == pytest.approx(2 / 3)
    assert m["reward/length/length"] == pytest.approx((9 + 12 + 30) / 3)
    assert m["reward/source/gsm8k/score"] == pytest.approx((1.2 + 0.2 + 1.05) / 3)


# -- ground truths that do not fit the domain ----------------------------------------------------------

OPTIONS = {"A": "Venus", "B": "Mars", "C": "Jupiter", "D": "Saturn"}


def mc_row(line, ground_truth, options=OPTIONS):
    return {
        "data_source": "multiple_choice",
        "ground_truth": ground_truth,
        "extra": {"options": options},
        "_where": f"t.jsonl, line {line}",
    }


def test_a_letter_not_among_the_options_is_an_error_naming_the_row(pm):
    with RewardManager(RewardConfig(), pm) as rm:
        rm.check_rows(
            [mc_row(1, "B"), mc_row(2, ["A", "C"]), mc_row(3, "Jupiter")], "t.jsonl"
        )  # letters, several, an option's text
        with pytest.raises(
            ConfigError,
            match=r"^t.jsonl, line 2: reward domain 'multiple_choice' cannot read .*E not among the options A, B, C, D",
        ):
            rm.check_rows([mc_row(1, "B"), mc_row(2, "E")], "t.jsonl")
        with pytest.raises(ConfigError, match=r"line 1: .*'Pluto' is neither an option letter nor an option's text"):
            rm.check_rows([mc_row(1, "Pluto")], "t.jsonl")


def test_an_empty_alias_list_is_an_error_naming_the_row(pm):
    rows = [
        {"data_source": "short_answer", "ground_truth": ["Paris", "Paris, France"], "_where": "t.jsonl, line 1"},
        {"data_source": "short_answer", "ground_truth": [], "_where": "t.jsonl, line 2"},
    ]
    with (
        RewardManager(RewardConfig(), pm) as rm,
        pytest.raises(ConfigError, match=r"^t.jsonl, line 2: .*holds no answer"),
    ):
        rm.check_rows(rows, "t.jsonl")


def test_skip_invalid_drops_and_counts_the_rows(pm):
    rows = [mc_row(1, "B"), mc_row(2, "E"), mc_row(3, "C"), mc_row(4, "F")]
    with RewardManager(RewardConfig(), pm) as rm:
        problems = rm.check_rows(rows, "t.jsonl", skip_invalid=True)
        assert [r["_where"] for r in rows] == ["t.jsonl, line 1", "t.jsonl, line 3"]
        assert (
            len(problems) == 2
            and problems[0].startswith("t.jsonl, line 2:")
            and problems[1].startswith("t.jsonl, line 4:")
        )
        with pytest.raises(ConfigError, match="every row was skipped"):
            rm.check_rows([mc_row(1, "E")], "t.jsonl", skip_invalid=True)


def test_bad_ground_truths_in_a_data_file(tmp_path):
    # the config path a user takes: prepare_data loads the file, checks the rows, and counts the skips
    from armor_core.loop.data import prepare_data

    path = tmp_path / "train.jsonl"
    rows = [
        {"prompt": "Which planet is red?", "data_source": "multiple_choice", "ground_truth": gt, "options": OPTIONS}
        for gt in ("B", "E", "D")
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = [f"data.train_files=[{path}]", "data.val_files=[]"]
    with pytest.raises(
        ConfigError, match=r"train.jsonl, line 2: reward domain 'multiple_choice' .*set data.skip_invalid=true"
    ):
        prepare_data(load_config(None, overrides))
    train, _ = prepare_data(load_config(None, overrides + ["data.skip_invalid=true"]))
    assert train.skipped == 1 and "line 2" in train.problems[0]
    assert [r["ground_truth"] for r in train.rows] == ["B", "D"]
