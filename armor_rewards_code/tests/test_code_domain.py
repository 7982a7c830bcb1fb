"""The code domain: extraction, ground-truth formats, comparison, scores and sub-scores, bad rows,
registration, and scoring through the RewardManager's worker pool (throughput, time limits)."""

import json
import time

import pytest
from armor_rewards_code.cases import RUNNERS, Runner, extract_program, same_stdout, same_value
from armor_rewards_code.domain import check_code_truth, code_reward

import armor_rewards_code
from armor_core.config.schema import ConfigError, RewardConfig
from armor_core.plugins import PluginManager
from armor_core.rewards.manager import RewardManager

FAST = {"timeout_s": 1.0, "total_timeout_s": 3.0}
DOUBLE = {"inputs": ["3\n", "10\n"], "outputs": ["6\n", "20"]}


def fenced(code, lang="python"):
    return f"Here it is:\n```{lang}\n{code}\n```\n"


def test_extraction_takes_the_last_block_in_the_language():
    py = RUNNERS["python"]
    text = "```python\nprint(1)\n```\n```text\nnot code\n```\n```py\nprint(2)\n```"
    assert extract_program(text, py) == "print(2)\n"
    assert extract_program("```\nprint(3)\n```", py) == "print(3)\n"  # unlabelled when no labelled one
    assert extract_program("print(4)", py) == ""
    assert extract_program("print(4)", py, whole_response=True) == "print(4)"


def test_stdout_comparison_is_whitespace_tolerant_by_line_with_optional_float_tolerance():
    assert same_stdout("1  2 \n3\n\n", "1 2\n3")
    assert not same_stdout("1 2 3", "1 2\n3")  # line structure matters
    assert not same_stdout("0.3333", "0.33333")
    assert same_stdout("0.3333", "0.33333", float_tol=1e-3)
    assert same_value((1, [2]), [1, [2]]) and same_value(5, [5])  # tuples as lists; APPS's [value]
    assert not same_value(True, 1) and not same_value("1", 1)


@pytest.mark.parametrize(
    "program, truth, partial, score, subs",
    [
        ("print(int(input()) * 2)", DOUBLE, False, 1.0, {"passed": 1.0}),
        ("n = int(input())\nprint(6 if n == 3 else 0)", DOUBLE, False, 0.0, {"passed": 0.5}),
        ("n = int(input())\nprint(6 if n == 3 else 0)", DOUBLE, True, 0.5, {"passed": 0.5}),
        ("print(int(input()) * 2)\nraise SystemExit(3)", DOUBLE, False, 0.0, {"passed": 0.0, "runtime_errors": 1.0}),
        ("while True: pass", {"inputs": ["1"], "outputs": ["1"]}, False, 0.0, {"passed": 0.0, "timeouts": 1.0}),
        ("def f(a, b):\n    return a + b", {"fn_name": "f", "inputs": [[1, 2], [2, 2]], "outputs": [3, 4]}, 0, 1.0, {}),
        (
            "class Solution:\n    def f(self, a):\n        return [a, a]",
            {"fn_name": "f", "inputs": [[1]], "outputs": [[1, 1]]},
            0,
            1.0,
            {},
        ),
        (
            "def add(a, b):\n    return a + b",
            {"test": "def check(candidate):\n    assert candidate(2, 3) == 5\n", "entry_point": "add"},
            False,
            1.0,
            {},
        ),
        (
            "def add(a, b):\n    return a - b",
            {"test": ["assert add(2, 0) == 2", "assert add(2, 3) == 5"], "entry_point": "add"},
            True,
            0.5,
            {"runtime_errors": 0.5},
        ),
        (
            "def add(a, b) return",
            {"test": "assert add(1, 1) == 2", "entry_point": "add"},
            False,
            0.0,
            {"compiled": 0.0},
        ),
    ],
)
def test_scores_and_sub_scores(program, truth, partial, score, subs):
    result = code_reward("", fenced(program), json.dumps(truth), {}, partial=bool(partial), **FAST)
    assert result.score == score
    expected = {"compiled": 1.0, "passed": score if not partial else score, "timeouts": 0.0, "runtime_errors": 0.0}
    expected.update(subs)
    assert {k: result.sub_scores[k] for k in expected} == pytest.approx(expected)
    assert result.sub_scores["no_code"] == 0.0


def test_no_code_scores_zero():
    result = code_reward("", "I would loop over the numbers.", DOUBLE, {}, **FAST)
    assert result.score == 0.0 and result.sub_scores["no_code"] == 1.0


@pytest.mark.parametrize(
    "truth, extra, message",
    [
        ({"inputs": [], "outputs": []}, {"index": 7}, "row 7: ground_truth 'inputs' and 'outputs' must be non-empty"),
        ({"cases": [1]}, {}, "neither 'inputs'/'outputs' nor 'test'/'entry_point' (keys: ['cases'])"),
        ({"test": "assert f(1)"}, {}, "needs 'entry_point'"),
        ("not json", {}, "not JSON"),
        (DOUBLE, {"language": "cobol"}, "no runner for language 'cobol' (runners: python)"),
    ],
)
def test_bad_rows_are_clear_errors(truth, extra, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        check_code_truth(truth, extra)


def test_another_language_is_a_runner(monkeypatch):
    monkeypatch.setitem(RUNNERS, "sh", Runner(fences=("sh", "bash"), argv=("/bin/sh", "{file}"), filename="main.sh"))
    assert code_reward("", fenced("read n; echo $((n * 2))", "sh"), DOUBLE, {"language": "sh"}, **FAST).score == 1.0
    assert code_reward("", fenced("read n; echo $n", "sh"), DOUBLE, {"language": "sh"}, **FAST).score == 0.0
    with pytest.raises(ValueError, match="runs stdin/stdout tests only"):
        check_code_truth({"fn_name": "f", "inputs": [[1]], "outputs": [1]}, {"language": "sh"})


def test_registered_through_the_entry_point():
    pm = PluginManager()  # loads the `armor` entry points: this pack's `code = "armor_rewards_code"`
    domain = pm.get("reward_domain", "code")
    assert domain.fn is armor_rewards_code.code_reward and not domain.inline  # runs in the killable pool


def _manager(**cfg):
    return RewardManager(RewardConfig(**cfg), PluginManager())


def test_throughput_through_the_reward_pool_and_time_limits_do_not_stall():
    good = fenced("print(int(input()) * 2)")

    def score(rm, responses):
        n = len(responses)
        return rm.score([""] * n, responses, ["code"] * n, [DOUBLE] * n)

    with _manager(num_workers=2, domain_kwargs={"code": FAST}) as rm:
        score(rm, [good] * 2)  # start the workers
        start = time.monotonic()
        batch = score(rm, [good] * 40)
        rate = 40 / (time.monotonic() - start)
        assert batch.scores.tolist() == [1.0] * 40
        assert rate >= 10, f"{rate:.1f} programs/s"
        start = time.monotonic()
        batch = score(rm, [fenced("while True: pass")] * 2)
        assert time.monotonic() - start < FAST["total_timeout_s"] + 1.0
        assert batch.scores.tolist() == [0.0, 0.0] and batch.metrics["reward/failures"] == 0


def test_a_bad_row_fails_at_load_naming_the_file_and_the_key():
    with _manager() as rm:
        with pytest.raises(ConfigError, match=r"data\.jsonl.*neither 'inputs'/'outputs' nor 'test'/'entry_point'"):
            rm.check_rows([{"prompt": "q", "data_source": "code", "ground_truth": {"cases": []}}], "data.jsonl")
        good = {"prompt": "q", "data_source": "code", "ground_truth": DOUBLE}
        bad = {"prompt": "q", "data_source": "code", "ground_truth": {"cases": []}}
        rows = [good, bad]
        assert len(rm.check_rows(rows, "data.jsonl", skip_invalid=True)) == 1 and rows == [good]  # a counted skip


def test_a_test_may_call_the_programs_own_helpers_as_humaneval_tests_do():
    # HumanEval/38 style: the test calls encode_cyclic, which the program (the prompt) defines
    program = "def encode(s):\n    return s[1:] + s[:1]\n\ndef decode(s):\n    return s[-1:] + s[:-1]\n"
    test = "def check(candidate):\n    import string\n    for w in ('abc', string.ascii_lowercase):\n        assert candidate(encode(w)) == w\n"
    truth = {"test": test, "entry_point": "decode"}
    assert code_reward("", f"```python\n{program}\n```", truth, {}).score == 1.0
    wrong = program.replace("s[-1:] + s[:-1]", "s")
    assert code_reward("", f"```python\n{wrong}\n```", truth, {}).score == 0.0
    # a name neither the test, the builtins nor the program defines fails the case
    missing = {"test": "def check(candidate):\n    assert candidate(helper('x')) == 'x'\n", "entry_point": "decode"}
    result = code_reward("", f"```python\n{program}\n```", missing, {})
    assert result.score == 0.0 and result.sub_scores["passed"] == 0.0
