"""``armor reward``: scoring a JSONL file or one example, malformed rows, parameters, exit codes.

The process-wide plugin manager is replaced by one holding only this file's domains, so the tests do
not depend on the installed reward packs.
"""

from __future__ import annotations

import argparse
import io
import json

import pytest

from armor_core import RewardDomain, RewardResult, hookimpl
from armor_core.cli.reward import add_parser
from armor_core.plugins import PluginManager


def exact(prompt, response, ground_truth, extra, *, bonus=0.0):
    hit = float(response.strip() == str(ground_truth))
    return RewardResult(
        hit + bonus, {"exact": hit, "weight": float(extra.get("weight", 0.0)), "prompt_len": float(len(prompt))}
    )


def fragile(prompt, response, ground_truth, extra):
    if response == "boom":
        raise RuntimeError("cannot score boom")
    return 1.0


def _integer(ground_truth, extra):
    try:
        int(str(ground_truth))
    except ValueError:
        raise ValueError(f"expected an integer, got {ground_truth!r}") from None


class _Plugin:
    @hookimpl
    def armor_register_reward_domains(self, register):
        register("integer", RewardDomain(exact, score_range=None, validate_ground_truth=_integer, inline=True))
        register(
            "exact", RewardDomain(exact, requires_ground_truth=True, score_range=None, inline=True)
        )  # bonus moves its scores
        register("fragile", RewardDomain(fragile, requires_ground_truth=False, inline=True))


@pytest.fixture(autouse=True)
def plugins(monkeypatch):
    pm = PluginManager(load_entrypoints=False, disabled=())
    pm.register(_Plugin(), name="cli_test_plugin")
    monkeypatch.setattr("armor_core.plugins._default", pm)


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="armor")
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["reward", *argv])
    return args.func(args)


def lines(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


def test_scores_a_file_in_order_reporting_malformed_rows(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        json.dumps({"prompt": "1+1=", "response": "2", "ground_truth": "2", "weight": 3})
        + "\n"
        + "{not json\n"
        + "\n"  # blank lines are not rows
        + json.dumps({"prompt": "2+2=", "response": "5", "ground_truth": 4})
        + "\n"
        + json.dumps([1, 2])
        + "\n"
        + json.dumps({"prompt": "x", "ground_truth": "1"})
        + "\n"
        + json.dumps({"prompt": "x", "response": "1"})
        + "\n"
        + json.dumps(
            {"prompt": [{"role": "user", "content": "abc"}], "response": "7", "reward_model": {"ground_truth": "7"}}
        )
        + "\n",
        encoding="utf-8",
    )
    assert run("exact", "--input", str(rows)) == 1
    out, err = capsys.readouterr()
    got = lines(out)
    assert [r["line"] for r in got] == [1, 2, 4, 5, 6, 7, 8]
    assert got[0] == {"line": 1, "score": 1.0, "sub_scores": {"exact": 1.0, "weight": 3.0, "prompt_len": 4.0}}
    assert got[1]["line"] == 2 and "not valid JSON" in got[1]["error"] and "score" not in got[1]
    assert got[2]["score"] == 0.0
    assert "expected a JSON object" in got[3]["error"]
    assert "no 'response' string" in got[4]["error"]
    assert "no 'ground_truth'" in got[5]["error"]
    assert got[6]["score"] == 1.0 and got[6]["sub_scores"]["prompt_len"] == 3.0  # chat messages, verl ground truth
    assert f"{rows}:2: malformed row: not valid JSON" in err
    assert "3 rows scored (mean 0.6667), 0 failed, 4 malformed" in err  # lines 1, 4, 8: 1, 0, 1


def test_all_good_rows_exit_zero_and_output_file(tmp_path):
    rows, out = tmp_path / "rows.jsonl", tmp_path / "out.jsonl"
    rows.write_text(
        "".join(json.dumps({"response": str(i), "ground_truth": str(i % 2)}) + "\n" for i in range(600)),
        encoding="utf-8",
    )
    assert run("exact", "-i", str(rows), "-o", str(out)) == 0
    got = lines(out.read_text(encoding="utf-8"))
    assert len(got) == 600  # more than one batch, still in order
    assert [r["score"] for r in got[:4]] == [1.0, 1.0, 0.0, 0.0]
    assert [r["line"] for r in got] == list(range(1, 601))


def test_parameters_are_json_values_and_checked(capsys):
    assert run("exact", "--response", "2", "--ground-truth", "2", "-p", "bonus=0.5") == 0
    assert json.loads(capsys.readouterr().out)["score"] == 1.5
    assert run("exact", "--response", "2", "--ground-truth", "2", "-p", "bonuss=1") == 2
    assert "unknown parameter 'bonuss' for reward domain 'exact'. Did you mean 'bonus'?" in capsys.readouterr().err
    assert run("exact", "--response", "2", "--ground-truth", "2", "-p", "bonus") == 2
    assert "is not KEY=VALUE" in capsys.readouterr().err


def test_one_example(capsys):
    assert run("exact", "--prompt", "1+1=", "--response", "2", "--ground-truth", "2", "--extra", '{"weight": 2}') == 0
    assert json.loads(capsys.readouterr().out) == {
        "score": 1.0,
        "sub_scores": {"exact": 1.0, "weight": 2.0, "prompt_len": 4.0},
    }
    assert run("exact", "--response", "2") == 2
    assert "requires --ground-truth" in capsys.readouterr().err
    assert run("fragile", "--response", "fine") == 0  # this domain needs no ground truth


def test_domain_failure_is_reported_per_row(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"response": "boom"}) + "\n" + json.dumps({"response": "ok"}) + "\n", encoding="utf-8")
    config = tmp_path / "run.yaml"
    config.write_text("reward:\n  failure_score: -2.0\n", encoding="utf-8")
    assert run("fragile", "-i", str(rows), "--config", str(config)) == 1
    got = lines(capsys.readouterr().out)
    assert got[0] == {"line": 1, "score": -2.0, "sub_scores": {}, "error": "fragile: RuntimeError: cannot score boom"}
    assert got[1] == {"line": 2, "score": 1.0, "sub_scores": {}}


def test_usage_errors(tmp_path, capsys):
    assert run("exact") == 2
    assert "either --input" in capsys.readouterr().err
    assert run("exakt", "--response", "1", "--ground-truth", "1") == 2
    err = capsys.readouterr().err
    assert (
        "unknown reward domain 'exakt'" in err
        and "Did you mean 'exact'?" in err
        and "Known domains: exact, fragile" in err
    )
    assert run("exact", "-i", str(tmp_path / "missing.jsonl")) == 2
    assert "cannot read --input" in capsys.readouterr().err
    assert run("exact", "--response", "1", "--ground-truth", "1", "--extra", "[1]") == 2
    assert "--extra must be a JSON object, got '[1]'" in capsys.readouterr().err


def test_reads_stdin(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"response": "3", "ground_truth": "3"}) + "\n"))
    assert run("exact", "-i", "-") == 0
    assert lines(capsys.readouterr().out)[0]["score"] == 1.0


def test_a_line_that_is_not_utf8_is_a_malformed_row(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_bytes(
        json.dumps({"response": "1", "ground_truth": "1"}).encode()
        + b"\n"
        + '{"response": "caf\u00e9", "ground_truth": "1"}'.encode("latin-1")
        + b"\n"
        + json.dumps({"response": "2", "ground_truth": "2"}, ensure_ascii=False).encode()
        + b"\n"
    )
    assert run("exact", "-i", str(rows)) == 1
    out = capsys.readouterr()
    assert [r.get("score") for r in lines(out.out)] == [1.0, None, 1.0]
    assert f"{rows}:2: malformed row: not UTF-8 text (byte 0xe9, the line's byte 18)" in out.err


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--timeout", "nan", "--timeout nan: give the time limit per row as a number of seconds > 0"),
        ("--timeout", "inf", "--timeout inf: give the time limit"),
        ("--timeout", "0", "--timeout 0.0: give the time limit"),
        ("--workers", "0", "--workers 0: give the number of scoring processes, at least 1"),
        ("--workers", "-2", "--workers -2: give the number of scoring processes"),
    ],
)
def test_timeout_and_workers_are_checked(capsys, flag, value, message):
    assert run("exact", "--response", "1", "--ground-truth", "1", flag, value) == 2
    assert message in capsys.readouterr().err


def test_output_into_a_missing_directory_is_a_usage_error(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"response": "1", "ground_truth": "1"}) + "\n")
    target = tmp_path / "no" / "such" / "out.jsonl"
    assert run("exact", "-i", str(rows), "-o", str(target)) == 2
    assert (
        f"cannot write --output '{target}': the directory '{target.parent}' does not exist" in capsys.readouterr().err
    )
    assert not target.parent.exists()


def file_reward_config(tmp_path, name: str, source: str, entry: str = ", requires_ground_truth: false") -> tuple:
    """``(reward file, run config naming it under reward.custom)``: the file ``<name>.py`` holds ``source``."""
    reward_file = tmp_path / f"{name}.py"
    reward_file.write_text(source)
    config = tmp_path / "run.yaml"
    config.write_text(f"reward:\n  custom:\n    - {{path: {reward_file}{entry}}}\n")
    return reward_file, config


def test_a_run_configs_file_reward_is_scored_by_name(tmp_path, capsys):
    _, config = file_reward_config(
        tmp_path,
        "shout",
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': float(solution_str.isupper()), 'chars': len(solution_str)}\n",
    )
    assert run("shout", "--config", str(config), "--response", "HEY") == 0
    assert json.loads(capsys.readouterr().out) == {"score": 1.0, "sub_scores": {"chars": 3.0}}


def _strict(text: str) -> dict:
    """JSON as the standard defines it: no Infinity or NaN, which Python's json writes and other readers refuse."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"not JSON: {name} in {text}"))


def test_a_file_reward_beyond_float32_fails_its_row_and_prints_valid_json(tmp_path, capsys):
    _, config = file_reward_config(
        tmp_path,
        "huge",
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': float(solution_str), 'part': float(solution_str)}\n",
    )
    assert run("huge", "--config", str(config), "--response=-1e39") == 1
    record = _strict(capsys.readouterr().out)
    assert record["score"] == 0.0 and record["sub_scores"] == {} and "outside the float32 range" in record["error"]


def test_a_reward_file_that_exits_at_import_is_a_usage_error_naming_it(tmp_path, capsys):
    reward_file, config = file_reward_config(tmp_path, "leaves", "import sys\nsys.exit(0)\n", entry="")
    assert run("leaves", "--config", str(config), "--response", "x", "--ground-truth", "1") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{reward_file}:2: the file exits while it is read (SystemExit(0))" in err


def test_a_ground_truth_the_domain_refuses_is_one_line_as_in_training(tmp_path, capsys):
    # one example: a usage error, exit 2, one line, no traceback (training refuses the row when the data loads)
    assert run("integer", "--response", "5", "--ground-truth", "five") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: armor reward: --ground-truth 'five': reward domain 'integer' cannot read")
    assert "expected an integer" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    # a file: that row is malformed, named by its line; the others are scored
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        json.dumps({"response": "5", "ground_truth": "5"})
        + "\n"
        + json.dumps({"response": "5", "ground_truth": "five"})
        + "\n"
    )
    assert run("integer", "--input", str(rows)) == 1
    out, err = capsys.readouterr()
    assert [r.get("score") for r in lines(out)] == [1.0, None]
    assert f"{rows}:2: malformed row: reward domain 'integer' cannot read this ground_truth" in err
    assert "Traceback" not in err
