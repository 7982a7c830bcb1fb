"""The math and gsm8k domains on whole responses (cases/domains.jsonl), the anti-hacking
rules among them, and their registration through the plugin hook."""

import json
from pathlib import Path

import pytest
from armor_rewards_math.domains import gsm8k_reward, math_reward, overlong_penalty
from armor_rewards_math.judge import gold_text

import armor_rewards_math
from armor_core.plugins import PluginManager

CASES = [
    json.loads(line)
    for line in (Path(__file__).parent / "cases" / "domains.jsonl").read_text(encoding="utf-8").splitlines()
    if line.strip()
]
FNS = {"math": math_reward, "gsm8k": gsm8k_reward}


@pytest.mark.parametrize("case", CASES, ids=[f"{c['domain']}-{i}" for i, c in enumerate(CASES)])
def test_domain_case(case):
    result = FNS[case["domain"]](
        case["prompt"], case["response"], case["ground_truth"], case["extra"], **case["params"]
    )
    assert result.score == pytest.approx(case["score"]), case["note"]
    for key, value in case["subs"].items():
        assert result.sub_scores[key] == pytest.approx(value), key


@pytest.fixture(scope="module")
def pm():
    manager = PluginManager(load_entrypoints=False)
    manager.register(armor_rewards_math, name="math")
    return manager


def test_registered_domains(pm):
    assert pm.names("reward_domain") == ["gsm8k", "math"]  # the arithmetic task's domain is armor-rl's own
    for name in ("gsm8k", "math"):
        assert pm.get("reward_domain", name).requires_ground_truth
    result = pm.get("reward_domain", "math")("q", r"\boxed{2}", "2", {})
    assert result.score == 1.0


def test_math_through_the_reward_manager_under_a_tight_limit(pm):
    # a fresh worker imports sympy in math's warm-up, outside the per-row limit; a row then takes 0.1-0.2 s, and the
    # limit leaves room for a loaded CI machine (at 1 s, one row of a clean-clone run on 2026-12-08 timed out)
    from armor_core.config.schema import RewardConfig
    from armor_core.rewards.manager import RewardManager

    with RewardManager(RewardConfig(timeout_s=2.0, failure_score=-1.0), pm) as rm:
        batch = rm.score(
            ["q", "q", "q"],
            [r"\boxed{\sqrt{8}}", r"\boxed{(x+1)^2}", "#### 3"],
            ["math", "math", "gsm8k"],
            [r"2\sqrt{2}", "x^2+2x+1", "3"],
            None,
        )
    assert batch.scores.tolist() == [1.0, 1.0, 1.0]
    assert batch.metrics["reward/timeouts"] == 0.0


def test_only_the_cheap_domains_run_inline(pm):
    # math may call sympy (can hang): it must go to the RewardManager's killable worker processes
    assert pm.get("reward_domain", "gsm8k").inline
    math = pm.get("reward_domain", "math")
    assert not math.inline and math.warmup is not None  # a worker imports sympy before its first timed check


@pytest.mark.parametrize("length, expected", [(0, 0.0), (80, 0.0), (81, -0.05), (90, -0.5), (100, -1.0), (101, -1.0)])
def test_overlong_penalty_dapo(length, expected):
    # L_max = 100, L_cache = 20: (80 - length) / 20 inside the buffer (DAPO eq. 13)
    assert overlong_penalty(length, 100, 20) == pytest.approx(expected)


def test_overlong_in_tokens_needs_the_response_length():
    with pytest.raises(ValueError, match="response_length"):
        math_reward("q", r"\boxed{1}", "1", {}, overlong_max_length=10, overlong_buffer=2)


def test_gsm8k_rejects_a_non_numeric_ground_truth():
    with pytest.raises(ValueError, match="not a number; use the 'math' domain"):
        gsm8k_reward("q", "#### 1", "x+1", {})


def test_unknown_answer_format_is_an_error():
    with pytest.raises(ValueError, match="unknown answer format 'boxd'"):
        math_reward("q", r"\boxed{1}", "1", {}, require_format="boxd")


def test_every_anti_hacking_rule_has_cases():
    rules = ("hedged", "restated", "echoed", "refused")
    notes = {k for c in CASES for k, v in c["subs"].items() if v == 1 and k in rules}
    assert notes == set(rules)
    assert any(c["params"].get("require_format") for c in CASES)
    assert any("overlong_max_length" in c["params"] for c in CASES)
    for rule in ("hedged", "restated", "echoed"):  # the rules hold for lenient extraction too
        assert any(c["params"].get("extraction") == "lenient" and c["subs"].get(rule) == 1 for c in CASES), rule
    assert {c["params"].get("decimal_separator", "auto") for c in CASES} == {"auto", "point", "comma"}


@pytest.mark.parametrize(
    "params, message",
    [
        ({"extraction": "loose"}, "use 'strict'"),
        ({"decimal_separator": "european"}, "auto, point, comma"),
    ],
)
def test_bad_option_values_are_errors(params, message):
    with pytest.raises(ValueError, match=message):
        math_reward("q", r"\boxed{1}", "1", {}, **params)


def test_extraction_and_decimal_separator_come_from_the_config(pm):
    # gsm8k runs in-process, so this starts no worker; math's parameters are checked at start all the same
    from armor_core.config.schema import ConfigError, RewardConfig
    from armor_core.rewards.manager import RewardManager

    kwargs = {"math": {"extraction": "lenient", "decimal_separator": "comma"}, "gsm8k": {"decimal_separator": "comma"}}
    with RewardManager(RewardConfig(domain_kwargs=kwargs), pm) as rm:
        batch = rm.score(["q", "q"], ["#### 1.234,5", "#### 1,5"], ["gsm8k", "gsm8k"], ["1234.5", "1.5"], None)
    assert batch.scores.tolist() == [1.0, 1.0]
    with pytest.raises(ConfigError, match="decimal_seperator"):
        RewardManager(RewardConfig(domain_kwargs={"math": {"decimal_seperator": "comma"}}), pm)


@pytest.mark.parametrize(
    "response, score",
    [
        (r"\boxed{1} and \boxed{2} and \boxed{3}", 1.0),
        (r"\boxed{1},\boxed{2},\boxed{3}", 1.0),
        (r"\boxed{\{3, 2, 1\}}", 1.0),
        (r"\boxed{3}", 0.0),  # one item of the set
        (r"\boxed{1}, \boxed{2}", 0.0),
    ],
)
def test_a_ground_truth_list_in_bare_braces_is_a_set(response, score):
    # {1,2,3}: LaTeX braces only group, but around a whole list they can only mean a set
    assert math_reward("q", response, "$${1,2,3}$$", {}).score == score


def test_a_ground_truth_solution_ending_in_a_final_answer_line():
    gold = (
        r"The stock keeps $90\%$ and then $80\%$ of that. Final Answer: The final answer is $28\%$. "
        "I hope it is correct. Note: the percentages multiply."
    )
    assert gold_text(gold) == r"28\%"
    assert math_reward("q", r"A loss of $\boxed{28\%}$.", gold, {}).score == 1.0
    assert math_reward("q", r"\boxed{72\%}", gold, {}).score == 0.0
    assert gold_text(r"So \boxed{5}. Final Answer: 5") == "5"
    assert gold_text("... #### 72") == "72"


@pytest.mark.parametrize("ground_truth", [{"answer": "4"}, [{"answer": "4"}]])
def test_a_dict_ground_truth_is_refused_at_load_naming_the_row_and_when_scored(pm, ground_truth):
    from armor_core.config.schema import ConfigError, RewardConfig
    from armor_core.rewards.manager import RewardManager

    rm = RewardManager(RewardConfig(), pm)
    rows = [
        {"data_source": "math", "ground_truth": "4", "_where": "t.jsonl, line 1"},
        {"data_source": "gsm8k", "ground_truth": ground_truth, "_where": "t.jsonl, line 2"},
    ]
    with pytest.raises(
        ConfigError,
        match=r"^t.jsonl, line 2: reward domain 'gsm8k' cannot read this ground_truth: ground_truth .* is a (dict|list of dicts); "
        r"expected the answer itself as text or a number",
    ):
        rm.check_rows(rows, "t.jsonl")
    with pytest.raises(
        ValueError, match="expected the answer itself"
    ):  # scored anyway (armor reward, a direct call): not str()-ed
        math_reward("q", r"\boxed{4}", ground_truth, {})


@pytest.mark.parametrize(
    "params, expected",
    [
        ({}, (0.0, 1.0)),
        ({"correct_score": 2.0, "wrong_score": -1.0}, (-1.0, 2.0)),
        ({"overlong_max_length": 10, "overlong_buffer": 4}, (-1.0, 1.0)),
        ({"overlong_max_length": 10, "overlong_penalty_factor": 0.5}, (-0.5, 1.0)),
    ],
)
def test_declared_score_range_follows_the_parameters(pm, params, expected):
    from armor_core.config.schema import RewardConfig
    from armor_core.rewards.manager import RewardManager

    rm = RewardManager(RewardConfig(domain_kwargs={"math": params, "gsm8k": params}), pm)
    for name in ("math", "gsm8k"):
        assert rm._domain(name, "test").score_range == expected
    scores = [gsm8k_reward("q", r, "4", {"response_length": 12}, **params).score for r in ("#### 4", "#### 5")]
    assert all(expected[0] <= s <= expected[1] for s in scores)  # what the domain really gives lies inside
