"""Reward functions from files (``reward.custom``): verl's signature unchanged, scored in the reward pool
from the source that travels with the domain, batched or row by row, and every way a file can be wrong
caught at start with the file and the line."""

from __future__ import annotations

import os
import pickle
import textwrap

import pytest

from armor_core.config.schema import ConfigError, RewardConfig, load_config
from armor_core.plugins import PluginManager
from armor_core.rewards.custom import FileFunction
from armor_core.rewards.manager import RewardManager

# the shape of a verl reward file, untouched: keyword arguments, extra_info=None, a dict with extras back
VERL_FILE = """
import os

def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    hit = solution_str.strip() == str(ground_truth)
    return {
        "score": float(hit) + bonus,
        "acc": hit,  # a bool, kept as a sub-score
        "pred": solution_str.strip(),  # text: left out of the sub-scores
        "from_source": float(data_source == "verl_math"),
        "row_index": float((extra_info or {}).get("index", -1)),
        "pid": float(os.getpid()),
    }
"""

BATCHED_FILE = """
import os

def compute_score(data_sources, solution_strs, ground_truths, extra_infos, scale=1.0):
    n = len(solution_strs)
    return [
        {"score": scale * float(s == g), "batch_rows": float(n), "pid": float(os.getpid())}
        for s, g in zip(solution_strs, ground_truths)
    ]
"""


def _file(tmp_path, text, name="my_reward.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _manager(*entries, **reward):
    return RewardManager(RewardConfig(custom=list(entries), **reward), PluginManager())


def _score(manager, responses, truths, sources=None, extras=None):
    n = len(responses)
    return manager.score(["p"] * n, responses, sources or ["verl_math"] * n, truths, extras)


def test_a_verl_reward_file_scores_unchanged_in_a_worker_process(tmp_path):
    path = _file(tmp_path, VERL_FILE)
    with _manager({"path": str(path), "data_sources": ["verl_math"]}) as manager:
        batch = _score(manager, ["4", " 5 ", "x"], ["4", "5", "6"], extras=[{"index": 7}, {}, {}])
    assert batch.scores.tolist() == [1.0, 1.0, 0.0]
    subs = batch.sub_scores
    assert subs["my_reward/acc"].tolist() == [1.0, 1.0, 0.0]
    assert "my_reward/pred" not in subs  # text is not a sub-score
    assert subs["my_reward/from_source"].tolist() == [1.0, 1.0, 1.0]  # data_source reached the function
    assert subs["my_reward/row_index"].tolist() == [7.0, -1.0, -1.0]  # extra_info is the row's extra
    assert set(subs["my_reward/pid"].tolist()) != {float(os.getpid())}  # scored in the pool, not the driver


def test_kwargs_from_the_entry_and_domain_kwargs_reach_the_function(tmp_path):
    path = _file(tmp_path, VERL_FILE)
    with _manager({"path": str(path), "data_sources": ["verl_math"], "kwargs": {"bonus": 0.5}}) as manager:
        assert _score(manager, ["4"], ["4"]).scores.tolist() == [1.5]
    entry = {"path": str(path), "data_sources": ["verl_math"], "kwargs": {"bonus": 0.5}}
    with _manager(entry, domain_kwargs={"my_reward": {"bonus": 2.0}}) as manager:
        assert _score(manager, ["4"], ["4"]).scores.tolist() == [3.0]
    with pytest.raises(ConfigError, match=r"unknown parameter 'bnus'.*Did you mean 'bonus'"):
        _manager({"path": str(path), "data_sources": ["verl_math"]}, domain_kwargs={"my_reward": {"bnus": 1}})


def test_a_batched_function_gets_the_whole_batch_in_one_call(tmp_path):
    path = _file(tmp_path, BATCHED_FILE)
    entry = {"path": str(path), "domain": "batch_exact", "data_sources": ["a", "b"], "batched": True}
    with _manager(entry, domain_map={"c": {"batch_exact": 2.0}}, num_workers=2) as manager:
        batch = _score(manager, ["1", "2", "3", "4", "5"], ["1", "0", "3", "4", "0"], sources=["a", "b", "c", "a", "b"])
    assert batch.scores.tolist() == [1.0, 0.0, 2.0, 1.0, 0.0]  # weights apply as for any domain
    assert batch.sub_scores["batch_exact/batch_rows"].tolist() == [5.0] * 5  # one call saw all five rows
    assert len(set(batch.sub_scores["batch_exact/pid"].tolist())) == 1


def test_a_function_that_raises_or_hangs_fails_its_rows_and_the_run_goes_on(tmp_path):
    path = _file(
        tmp_path,
        """
        import time

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if solution_str == "hang":
                time.sleep(60)
            return 1 / int(solution_str)
        """,
    )
    with _manager({"path": str(path), "data_sources": ["verl_math"]}, timeout_s=2.0, failure_score=-1.0) as manager:
        batch = _score(manager, ["1", "0", "hang", "4"], [None] * 4)
        assert batch.scores.tolist() == [1.0, -1.0, -1.0, 0.25]
        assert batch.metrics["reward/failures"] == 2 and batch.metrics["reward/timeouts"] == 1
        assert "ZeroDivisionError" in batch.errors[1] and "timeout_s" in batch.errors[2]
        assert _score(manager, ["2"], [None]).scores.tolist() == [0.5]  # a fresh worker took over


def test_a_batched_call_that_fails_fails_every_row_of_the_call(tmp_path):
    path = _file(
        tmp_path,
        """
        def compute_score(data_sources, solution_strs, ground_truths, extra_infos):
            return [1.0] * (len(solution_strs) - 1)
        """,
    )
    with _manager({"path": str(path), "data_sources": ["verl_math"], "batched": True}, failure_score=-1.0) as m:
        batch = _score(m, ["a", "b"], [None, None])
    assert batch.scores.tolist() == [-1.0, -1.0]
    assert "returned 1 results for 2 rows" in batch.errors[0]


def test_the_source_travels_with_the_domain_not_the_path(tmp_path):
    # a reward worker on another machine has no copy of the file: it gets the source in the pickle
    path = _file(tmp_path, VERL_FILE)
    fn = FileFunction(str(path), "compute_score", path.read_text())
    path.unlink()
    copy = pickle.loads(pickle.dumps(fn))
    assert copy(prompt="p", response="4", ground_truth="4", extra={}).score == 1.0
    with _manager({"path": str(_file(tmp_path, VERL_FILE)), "data_sources": ["verl_math"]}) as manager:
        (tmp_path / "my_reward.py").unlink()  # gone before the workers start
        assert _score(manager, ["4"], ["4"]).scores.tolist() == [1.0]


@pytest.mark.parametrize(
    ("text", "entry", "message"),
    [
        ("def compute_score(a, b\n", {}, r"my_reward\.py:1: '\(' was never closed"),
        ("x = 1\n\nimport not_a_module_anywhere\n", {}, r"my_reward\.py:3: ModuleNotFoundError"),
        ("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1\n", {},
         r"defines no 'compute_score'; functions it defines: score"),
        ("compute_score = 3\n", {}, r"'compute_score' is a int, not a function"),
        ("\n\ndef compute_score(response, answer):\n    return 1\n", {},
         r"my_reward\.py:3: compute_score cannot be called as verl calls it, one row a call"),
        ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1\n",
         {"batched": True}, r"batched \(lists in, a list out\)"),
        ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1\n",
         {"colour": "red"}, r"unknown key\(s\) colour"),
        ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1\n",
         {"domain": "format"}, r"the domain name 'format' is taken \(an installed domain\)"),
        ("import sys\nsys.exit(0)\n", {}, r"my_reward\.py:2: the file exits while it is read \(SystemExit\(0\)\)"),
        ("raise BaseException('bye')\n", {}, r"my_reward\.py:1: BaseException: bye"),
    ],
)  # fmt: skip
def test_a_bad_file_is_one_line_at_start_naming_the_file_and_line(tmp_path, text, entry, message):
    path = _file(tmp_path, text)
    pm = PluginManager()
    with pytest.raises(ConfigError, match=message) as info:
        RewardManager(RewardConfig(custom=[{"path": str(path), "data_sources": ["s"], **entry}]), pm)
    assert "\n" not in str(info.value) and "reward.custom[0]" in str(info.value)


def test_a_missing_file_and_a_source_routed_twice_are_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"reward.custom\[0\].path: .*nowhere.py is not a file"):
        _manager({"path": str(tmp_path / "nowhere.py")})
    path = _file(tmp_path, VERL_FILE)
    with pytest.raises(ConfigError, match=r"data_source 'verl_math' is routed twice"):
        _manager({"path": str(path), "data_sources": ["verl_math"]}, domain_map={"verl_math": "format"})


def test_rows_without_a_ground_truth_are_refused_at_load_unless_the_entry_says_none_is_needed(tmp_path):
    path = _file(tmp_path, VERL_FILE)
    rows = [{"data_source": "verl_math", "prompt": "p"}]
    with _manager({"path": str(path), "data_sources": ["verl_math"]}) as manager:
        with pytest.raises(ConfigError, match=r"no ground_truth but their reward domain requires one"):
            manager.check_rows(rows, "train.jsonl")
    with _manager({"path": str(path), "data_sources": ["verl_math"], "requires_ground_truth": False}) as manager:
        manager.check_rows(rows, "train.jsonl")


def test_reward_custom_is_set_from_the_command_line(tmp_path):
    path = _file(tmp_path, VERL_FILE)
    cfg = load_config(None, [f"reward.custom=[{{path: {path}, data_sources: [verl_math]}}]"])
    with RewardManager(cfg.reward, PluginManager()) as manager:
        assert manager.domains_for("verl_math") == {"my_reward": 1.0}


def test_a_score_beyond_float32_fails_its_row_as_a_non_finite_one_does(tmp_path):
    # 1e39 is a finite float64 but +inf in the float32 the scores are trained in: the guard would skip every step
    path = _file(
        tmp_path,
        """
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if solution_str == "part":
                return {"score": 1.0, "part": 1e39}
            return float(solution_str)
        """,
    )
    with _manager({"path": str(path), "data_sources": ["verl_math"]}, failure_score=-1.0) as manager:
        batch = _score(manager, ["1e39", "-1e39", "inf", "part", "0.5"], [None] * 5)
    assert batch.scores.tolist() == [-1.0, -1.0, -1.0, -1.0, 0.5]
    assert batch.metrics["reward/failures"] == 4 and batch.metrics["reward/my_reward/failures"] == 4
    assert "outside the float32 range" in batch.errors[0] and "sub-score 'part'" in batch.errors[3]


def test_a_weighted_sum_beyond_float32_fails_the_row(tmp_path):
    path = _file(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                           "    return float(solution_str)\n")  # fmt: skip
    with _manager({"path": str(path)}, domain_map={"big": {"my_reward": 10.0}}, failure_score=-1.0) as manager:
        batch = _score(manager, ["3e38", "1"], [None] * 2, sources=["big", "big"])
    assert batch.scores.tolist() == [-10.0, 10.0] and batch.metrics["reward/failures"] == 1
    assert "float32" in batch.errors[0]


def test_domain_map_routes_rows_to_a_file_domain_beside_an_installed_one(tmp_path):
    from armor_core.config.plugin_checks import validate_plugins

    path = _file(tmp_path, VERL_FILE)
    cfg = load_config(
        None,
        [f"reward.custom=[{{path: {path}, domain: mine}}]", "reward.domain_map.chat={mine: 1.0, format: 0.5}"],
    )
    validate_plugins(cfg, PluginManager())  # what armor run checks first: 'mine' is the config's own domain
    with RewardManager(cfg.reward, PluginManager()) as manager:
        assert manager.domains_for("chat") == {"mine": 1.0, "format": 0.5}
        batch = manager.score(["p"], ["4"], ["chat"], ["4"])
    assert batch.sub_scores["mine/score"].tolist() == [1.0] and "format/score" in batch.sub_scores
