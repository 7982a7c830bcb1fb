"""RewardManager: routing, weights, parameters, failures, score ranges, time limits, row checks,
and the failure rate that stops a training run.

The domains are registered by a plugin object inside the test, so nothing depends on the installed
reward packs. Domains that run in worker processes are module-level functions (a worker imports
them by name, as it would a pack's).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time

import numpy as np
import pytest

from armor_core import RewardDomain, RewardResult, hookimpl
from armor_core.config.schema import ConfigError, RewardConfig
from armor_core.plugins import PluginManager
from armor_core.rewards.checks import RewardFailureError
from armor_core.rewards.manager import RewardManager, ground_truth_of


def exact(prompt, response, ground_truth, extra, *, bonus=0.0):
    hit = float(response == ground_truth)
    return RewardResult(hit + bonus, {"exact": hit, "pid": float(os.getpid())})


def _exact_range(params):
    return params["bonus"], 1.0 + params["bonus"]


def loud(prompt, response, ground_truth, extra):
    return float(response)


def _refuse_lists(ground_truth, extra):
    if isinstance(ground_truth, list):
        raise ValueError("a list is not an answer")


def _needs_options(ground_truth, extra):
    if ground_truth not in extra["options"]:  # a bug: a row without options raises KeyError, not ValueError
        raise ValueError("not an option")


def picky(prompt, response, ground_truth, extra):
    return 1.0


def short(prompt, response, ground_truth, extra):
    return RewardResult(float(len(response) <= 3), {"short": float(len(response) <= 3)})


def flaky(prompt, response, ground_truth, extra):
    if response == "boom":
        raise ZeroDivisionError("boom on purpose")
    if response == "key":
        raise KeyError("missing")
    if response == "exit":
        sys.exit(0)  # a reward file or judge calling sys.exit() while it scores
    return 1.0


def not_finite(prompt, response, ground_truth, extra):
    return float("nan")


def textual(prompt, response, ground_truth, extra):
    """A bug: the score as text ("1"), or a sub-score that is NaN."""
    return RewardResult(1.0, {"part": float("nan")}) if response == "nan part" else response


def reserved(prompt, response, ground_truth, extra):
    return RewardResult(1.0, {"score": 1.0})


def slow(prompt, response, ground_truth, extra):
    """Runs in a worker process: may hang, crash or raise."""
    if response == "hang":
        time.sleep(60)
    if response == "crash":
        os._exit(3)
    if response == "raise":
        raise ValueError("raised in a worker")
    if response == "exit":
        sys.exit(0)
    return RewardResult(
        float(response == ground_truth), {"exact": float(response == ground_truth), "pid": float(os.getpid())}
    )


_WARMED = []


def _slow_warmup():
    time.sleep(0.8)  # longer than the 0.5 s limit of the `pooled` manager
    _WARMED.append(True)


def warmed(prompt, response, ground_truth, extra):
    return float(bool(_WARMED))  # 1 only in a worker that ran the warm-up


class _Plugin:
    @hookimpl
    def armor_register_reward_domains(self, register):
        # inline: scored in this process; slow and warmed go to the reward worker processes
        register("exact", RewardDomain(exact, requires_ground_truth=True, score_range=_exact_range, inline=True))
        register("loud", RewardDomain(loud, requires_ground_truth=False, inline=True))  # the default range, [0, 1]
        register("unbounded", RewardDomain(loud, requires_ground_truth=False, score_range=None, inline=True))
        register("reversed_range", RewardDomain(loud, requires_ground_truth=False, score_range=(1.0, 0.0), inline=True))
        register(
            "picky", RewardDomain(picky, requires_ground_truth=True, validate_ground_truth=_refuse_lists, inline=True)
        )
        register(
            "options_check",
            RewardDomain(picky, requires_ground_truth=True, validate_ground_truth=_needs_options, inline=True),
        )
        register("short", RewardDomain(short, requires_ground_truth=False, inline=True))
        register("flaky", RewardDomain(flaky, requires_ground_truth=False, inline=True))
        register("not_finite", RewardDomain(not_finite, requires_ground_truth=False, inline=True))
        register("reserved", RewardDomain(reserved, requires_ground_truth=False, inline=True))
        register("textual", RewardDomain(textual, requires_ground_truth=False, inline=True))
        register("slow", RewardDomain(slow, requires_ground_truth=True))
        register("warmed", RewardDomain(warmed, requires_ground_truth=False, warmup=_slow_warmup))
        register("lambda_domain", RewardDomain(lambda p, r, g, e: 1.0, requires_ground_truth=False))


@pytest.fixture(scope="module")
def pm():
    manager = PluginManager(load_entrypoints=False, disabled=())
    manager.register(_Plugin(), name="test_rewards_plugin")
    return manager


def score(rm, rows):
    """rows: (data_source, response, ground_truth)"""
    return rm.score(
        ["p"] * len(rows), [r[1] for r in rows], [r[0] for r in rows], [r[2] for r in rows], [{} for _ in rows]
    )


# -- routing and parameters ------------------------------------------------------------------------


def test_routing_by_name_by_map_and_with_weights(pm):
    rm = RewardManager(RewardConfig(domain_map={"gsm": "exact", "mix": {"exact": 1.0, "short": 0.1}}), pm)
    assert rm.domains_for("exact") == {"exact": 1.0}  # a source named like a domain
    assert rm.domains_for("gsm") == {"exact": 1.0}
    assert rm.domains_for("mix") == {"exact": 1.0, "short": 0.1}


def test_unknown_source_lists_known_domains_and_nearest(pm):
    rm = RewardManager(RewardConfig(), pm)
    with pytest.raises(ConfigError) as e:
        rm.domains_for("exakt")
    msg = str(e.value)
    assert (
        "'exakt'" in msg
        and "Did you mean 'exact'?" in msg
        and "exact, flaky" in msg
        and "reward.domain_map.exakt=" in msg
    )


def test_unknown_domain_in_the_map_fails_at_construction(pm):
    with pytest.raises(
        ConfigError, match=r"reward.domain_map.gsm: unknown reward domain 'exct'\. Did you mean 'exact'\?"
    ):
        RewardManager(RewardConfig(domain_map={"gsm": "exct"}), pm)
    with pytest.raises(ConfigError, match=r"reward.domain_map.gsm.exact='high': a weight must be a finite number"):
        RewardManager(RewardConfig(domain_map={"gsm": {"exact": "high"}}), pm)


def test_unknown_parameter_names_domain_and_key(pm):
    with pytest.raises(ConfigError) as e:
        RewardManager(RewardConfig(domain_kwargs={"exact": {"bonnus": 1.0}}), pm)
    assert (
        "reward.domain_kwargs.exact: unknown parameter 'bonnus' for reward domain 'exact'. Did you mean "
        "'bonus'? It accepts: bonus" == str(e.value)
    )
    with pytest.raises(ConfigError, match="unknown reward domain 'exactt'"):
        RewardManager(RewardConfig(domain_kwargs={"exactt": {}}), pm)


def test_parameters_reach_the_domain(pm):
    rm = RewardManager(RewardConfig(domain_kwargs={"exact": {"bonus": 0.5}}), pm)
    assert score(rm, [("exact", "a", "a"), ("exact", "a", "b")]).scores.tolist() == [1.5, 0.5]


def test_domain_that_cannot_reach_a_worker_is_rejected(pm):
    rm = RewardManager(RewardConfig(), pm)
    with pytest.raises(ConfigError, match="'lambda_domain'.*cannot be sent to a reward worker process.*inline=True"):
        rm.domains_for("lambda_domain")


# -- scores, sub-scores, metrics ---------------------------------------------------------------------


def test_weighted_sum_sub_scores_and_metrics(pm):
    rm = RewardManager(RewardConfig(domain_map={"mix": {"exact": 1.0, "short": 0.1}}), pm)
    batch = score(rm, [("mix", "abc", "abc"), ("mix", "abcd", "x"), ("exact", "y", "y"), ("short", "zz", None)])
    # row 0: 1*1 + 0.1*1; row 1: 1*0 + 0.1*0; row 2: exact only; row 3: short only
    np.testing.assert_allclose(batch.scores, [1.1, 0.0, 1.0, 1.0], rtol=1e-6)
    assert batch.scores.dtype == np.float32
    exact_col = batch.sub_scores["exact/exact"]
    assert exact_col[:3].tolist() == [1.0, 0.0, 1.0] and math.isnan(exact_col[3])  # row 3 has no exact domain
    assert math.isnan(batch.sub_scores["short/short"][2])
    m = batch.metrics
    assert m["reward/exact/exact"] == pytest.approx(2 / 3)  # nanmean over the 3 rows exact scored
    assert m["reward/short/short"] == pytest.approx(2 / 3)  # rows 0, 1, 3: 1, 0, 1
    assert m["reward/source/mix/score"] == pytest.approx(0.55)
    assert m["reward/source/exact/score"] == 1.0
    assert m["reward/mean"] == pytest.approx((1.1 + 0 + 1 + 1) / 4)
    assert m["reward/failures"] == 0.0 and m["reward/timeouts"] == 0.0
    assert all(math.isfinite(v) for v in m.values())
    assert batch.errors == [None] * 4


def test_empty_batch(pm):
    batch = RewardManager(RewardConfig(), pm).score([], [], [], [], [])
    assert batch.scores.shape == (0,) and batch.metrics["reward/failures"] == 0.0


def test_mismatched_lengths_are_an_error(pm):
    with pytest.raises(ValueError, match="responses has 1 entries but prompts has 2"):
        RewardManager(RewardConfig(), pm).score(["a", "b"], ["x"], ["exact", "exact"], ["x", "x"], None)


# -- failures -----------------------------------------------------------------------------------------


def test_failure_scores_failure_score_counts_and_logs_once_per_kind(pm, caplog):
    rm = RewardManager(RewardConfig(failure_score=-1.0, domain_map={"both": {"flaky": 1.0, "short": 0.5}}), pm)
    rows = [
        ("flaky", "boom", None),
        ("flaky", "ok", None),
        ("flaky", "boom", None),
        ("flaky", "key", None),
        ("both", "boom", None),
    ]
    with caplog.at_level(logging.ERROR, logger="armor_core.rewards.manager"):
        batch = score(rm, rows)
    # the failing domain gives failure_score for its part only: row 4 = 1.0 * -1 + 0.5 * short("boom") = -1 + 0
    assert batch.scores.tolist() == [-1.0, 1.0, -1.0, -1.0, -1.0]
    assert batch.metrics["reward/failures"] == 4.0 and batch.metrics["reward/flaky/failures"] == 4.0
    assert batch.metrics["reward/timeouts"] == 0.0
    assert batch.errors[0] == "flaky: ZeroDivisionError: boom on purpose" and batch.errors[1] is None
    records = [r for r in caplog.records if r.name == "armor_core.rewards.manager"]
    assert len(records) == 2  # ZeroDivisionError once, KeyError once
    assert "example row" in records[0].getMessage() and "'boom'" in records[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="armor_core.rewards.manager"):
        score(rm, rows)
    assert not caplog.records  # already logged for this run


def test_non_finite_score_and_reserved_sub_score_are_failures(pm):
    rm = RewardManager(RewardConfig(failure_score=0.25), pm)
    batch = score(rm, [("not_finite", "a", None), ("reserved", "a", None)])
    assert batch.scores.tolist() == [0.25, 0.25]
    assert "non-finite score nan" in batch.errors[0] and "'score' is reserved" in batch.errors[1]


def test_a_score_given_as_text_or_a_nan_sub_score_fails_its_row(pm):
    """float("1") is 1.0: a domain returning text would otherwise pass as a full score."""
    rm = RewardManager(RewardConfig(failure_score=-1.0), pm)
    batch = score(rm, [("textual", "1", None), ("textual", "nan part", None), ("textual", 1, None)])
    assert batch.scores.tolist() == [-1.0, -1.0, 1.0]
    assert "the domain returned the score '1', a str; return a number" in batch.errors[0]
    assert "non-finite sub-score 'part' nan" in batch.errors[1] and batch.errors[2] is None


def test_a_score_outside_the_declared_range_fails_its_row(pm):
    rm = RewardManager(RewardConfig(failure_score=-1.0, domain_kwargs={"exact": {"bonus": 0.5}}), pm)
    batch = score(
        rm,
        [
            ("loud", "0.5", None),
            ("loud", "5", None),
            ("loud", "-0.1", None),
            ("unbounded", "5", None),
            ("exact", "a", "a"),
        ],
    )
    assert batch.scores.tolist() == [0.5, -1.0, -1.0, 5.0, 1.5]  # exact's range follows its bonus: [0.5, 1.5]
    assert batch.errors[1] == (
        "loud: score 5 is outside the domain's score_range [0, 1]; return a score in it, "
        "or register the domain with the score_range its scores really have"
    )
    assert batch.metrics["reward/loud/failures"] == 2.0 and batch.errors[3] is None and batch.errors[4] is None


def test_a_malformed_score_range_is_an_error_naming_the_domain(pm):
    rm = RewardManager(RewardConfig(), pm)
    with pytest.raises(
        ConfigError, match=r"reward domain 'reversed_range' declares score_range=\(1.0, 0.0\); expected \(low, high\)"
    ):
        rm.domains_for("reversed_range")
    with pytest.raises(
        ConfigError, match=r"'exact': its score_range cannot be computed for the parameters \{'bonus': 'x'\}"
    ):
        RewardManager(RewardConfig(domain_kwargs={"exact": {"bonus": "x"}}), pm)


def test_a_domain_failing_on_too_many_rows_stops_a_watched_manager(pm):
    cfg = RewardConfig(failure_score=-1.0, max_failure_fraction=0.5, failure_window=2)
    watched, counting = RewardManager(cfg, pm, watch_failures=True), RewardManager(cfg, pm)
    batches = [
        [("flaky", "boom", None)] + [("flaky", "ok", None)] * 3,  # 1 of 4 fail
        [("flaky", "boom", None)] * 3 + [("flaky", "ok", None)],  # 3 of 4: 4 of 8 in the window, not more than half
        [("flaky", "key", None)] * 4 + [("short", "ok", None)],
    ]  # 4 of 4: 7 of 8 (short's rows do not count for flaky)
    for rows in batches[:2]:
        score(watched, rows)
    with pytest.raises(RewardFailureError) as e:
        score(watched, batches[2])
    message = str(e.value)
    assert message.startswith(
        "reward domain 'flaky' failed on 7 of its 8 rows in the last 2 scored batches, more than "
        "reward.max_failure_fraction=0.5; e.g. KeyError: 'missing' (data_source 'flaky', ground_truth None)."
    )
    assert "\n" not in message and "checkpoints already written" in message
    for rows in batches:  # armor reward's manager counts failures and goes on
        assert score(counting, rows).metrics["reward/flaky/failures"] >= 1
    lenient = RewardManager(RewardConfig(max_failure_fraction=1.0), pm, watch_failures=True)
    assert score(lenient, batches[2]).metrics["reward/flaky/failures"] == 4.0  # 1 never stops


# -- worker processes and time limits ----------------------------------------------------------------


@pytest.fixture(scope="module")
def pooled(pm):
    rm = RewardManager(RewardConfig(timeout_s=0.5, failure_score=-1.0), pm)
    yield rm
    rm.close()


def test_inline_domains_stay_in_process_others_go_to_a_worker(pooled):
    batch = score(pooled, [("exact", "a", "a"), ("slow", "a", "a"), ("slow", "b", "a")])
    assert batch.scores.tolist() == [1.0, 1.0, 0.0]
    pids = batch.sub_scores["exact/pid"][0], batch.sub_scores["slow/pid"][1]
    assert pids[0] == os.getpid() and pids[1] != os.getpid()


def test_hung_check_times_out_and_the_worker_is_replaced(pooled, caplog):
    with caplog.at_level(logging.WARNING, logger="armor_core.rewards.manager"):
        start = time.monotonic()
        batch = score(pooled, [("slow", "a", "a"), ("slow", "hang", "a"), ("slow", "c", "c")])
        elapsed = time.monotonic() - start
    assert batch.scores.tolist() == [1.0, -1.0, 1.0]
    assert batch.metrics["reward/timeouts"] == 1.0 and batch.metrics["reward/failures"] == 1.0
    assert "timeout_s=0.5" in batch.errors[1]
    assert elapsed < 30  # not the 60 s the check would have slept
    assert any("timed out" in r.getMessage() for r in caplog.records)
    assert score(pooled, [("slow", "d", "d")]).scores.tolist() == [1.0]  # the replacement works


def test_warmup_runs_before_the_clock_starts(pooled):
    # a fresh worker's warm-up (importing sympy, say) must not count against the per-row limit
    batch = score(pooled, [("warmed", "a", None), ("warmed", "b", None)])
    assert batch.scores.tolist() == [1.0, 1.0] and batch.metrics["reward/timeouts"] == 0.0


def test_crashed_and_raising_workers_are_failures(pooled):
    batch = score(pooled, [("slow", "crash", "a"), ("slow", "raise", "a"), ("slow", "e", "e")])
    assert batch.scores.tolist() == [-1.0, -1.0, 1.0]
    assert "died (exit code 3)" in batch.errors[0]
    assert batch.errors[1] == "slow: ValueError: raised in a worker"
    assert batch.metrics["reward/timeouts"] == 0.0


def test_a_domain_that_calls_sys_exit_fails_its_row_in_process_and_in_a_worker(pooled):
    # issue 42, item 1: a SystemExit from a domain ended the process (inline: the driver, with exit 0)
    batch = score(pooled, [("flaky", "exit", None), ("slow", "exit", "a"), ("slow", "e", "e"), ("flaky", "ok", None)])
    assert batch.scores.tolist() == [-1.0, -1.0, 1.0, 1.0]
    assert batch.errors[0] == "flaky: SystemExit: 0" and batch.errors[1] == "slow: SystemExit: 0"
    assert batch.metrics["reward/failures"] == 2.0
    assert score(pooled, [("slow", "e", "e")]).scores.tolist() == [1.0]  # the worker still scores


def test_time_limit_holds_outside_the_main_thread(pooled):
    out = {}
    thread = threading.Thread(
        target=lambda: out.update(batch=score(pooled, [("slow", "hang", "a"), ("slow", "f", "f")]))
    )
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert out["batch"].scores.tolist() == [-1.0, 1.0] and out["batch"].metrics["reward/timeouts"] == 1.0


def test_several_workers_keep_row_order_and_close_stops_them(pm):
    rm = RewardManager(RewardConfig(num_workers=2, timeout_s=5.0), pm)
    responses = [str(i) for i in range(12)]
    batch = rm.score(
        ["p"] * 12, responses, ["slow"] * 12, ["0", "1", "x", "3", "x", "5", "6", "x", "8", "9", "x", "11"], None
    )
    assert batch.scores.tolist() == [1, 1, 0, 1, 0, 1, 1, 0, 1, 1, 0, 1]
    procs = [w.proc for w in rm._pool._workers]
    assert len(procs) == 2
    rm.close()
    assert all(not p.is_alive() for p in procs)


# -- row checks at start -------------------------------------------------------------------------------


def test_check_rows_reports_missing_ground_truth_with_location(pm):
    rm = RewardManager(RewardConfig(domain_map={"gsm": "exact"}), pm)
    rows = [
        {"data_source": "gsm", "ground_truth": "1", "_line": 1},
        {"data_source": "gsm", "_line": 2},
        {"data_source": "short", "_line": 3},
        {"data_source": "gsm", "ground_truth": "  ", "_line": 4},
    ]
    with pytest.raises(ConfigError) as e:
        rm.check_rows(rows, "train.jsonl")
    assert str(e.value).startswith(
        "train.jsonl: 2 row(s) have no ground_truth but their reward domain requires one: "
        "train.jsonl: line 2 (data_source 'gsm' -> domain 'exact'); train.jsonl: line 4 (data_source 'gsm' "
        "-> domain 'exact')"
    )


def test_check_rows_uses_the_loaders_location(pm):
    rm = RewardManager(RewardConfig(), pm)
    with pytest.raises(
        ConfigError, match=r"^a.jsonl, b.jsonl: 1 row\(s\) .*: b.jsonl:7 \(data_source 'exact' -> domain 'exact'\)"
    ):
        rm.check_rows([{"data_source": "exact", "ground_truth": None, "_where": "b.jsonl:7"}], "a.jsonl, b.jsonl")


def test_check_rows_reports_unroutable_source_and_missing_field(pm):
    rm = RewardManager(RewardConfig(), pm)
    with pytest.raises(
        ConfigError, match=r"train.jsonl: row 1: data_source 'gsm8' maps to no reward domain.*Known domains: exact"
    ):
        rm.check_rows([{"data_source": "exact", "ground_truth": "1"}, {"data_source": "gsm8"}], "train.jsonl")
    with pytest.raises(ConfigError, match=r"val.jsonl: line 7: the row has no 'data_source' field"):
        rm.check_rows([{"prompt": "x", "_line": 7}], "val.jsonl")


def test_check_rows_refuses_a_ground_truth_its_domain_cannot_read(pm):
    rm = RewardManager(RewardConfig(), pm)
    rm.check_rows([{"data_source": "picky", "ground_truth": "4", "_where": "t.jsonl, line 1"}], "t.jsonl")
    rows = [
        {"data_source": "picky", "ground_truth": "4", "_where": "t.jsonl, line 1"},
        {"data_source": "picky", "ground_truth": ["4"], "_where": "t.jsonl, line 2"},
    ]
    with pytest.raises(
        ConfigError,
        match=r"^t.jsonl, line 2: reward domain 'picky' cannot read this ground_truth: a list is not an answer "
        r"\(set data.skip_invalid",
    ):
        rm.check_rows(rows, "t.jsonl")


def test_a_ground_truth_check_that_breaks_is_an_error_naming_the_domain_and_row(pm):
    rm = RewardManager(RewardConfig(), pm)
    rows = [
        {"data_source": "options_check", "ground_truth": "a", "extra": {"options": ["a"]}, "_where": "t.jsonl, line 1"}
    ]
    rm.check_rows(rows, "t.jsonl")
    with pytest.raises(ConfigError, match=r"^t.jsonl, line 2: reward domain 'options_check': its validate_ground_truth "
                       r"raised KeyError: 'options' on the ground truth 'a'; a check raises ValueError"):  # fmt: skip
        rm.check_rows(
            [*rows, {"data_source": "options_check", "ground_truth": "a", "_where": "t.jsonl, line 2"}], "t.jsonl"
        )
    assert rm.ground_truth_problem("options_check", "b", {"options": ["a"]}) == (
        "reward domain 'options_check' cannot read this ground_truth: not an option"
    )


def test_check_rows_accepts_verl_layout_and_is_fast(pm):
    rm = RewardManager(RewardConfig(), pm)
    assert ground_truth_of({"reward_model": {"ground_truth": "4"}}) == "4"
    rows = [{"data_source": "exact", "reward_model": {"ground_truth": str(i)}} for i in range(200_000)]
    start = time.perf_counter()
    rm.check_rows(rows, "big.jsonl")
    assert time.perf_counter() - start < 5.0  # about 0.1 s; generous for a loaded CI machine
