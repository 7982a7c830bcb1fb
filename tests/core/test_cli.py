"""The `armor` command line: help for every command, and errors printed as one clear line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from armor_core.cli import build_parser, main

COMMANDS = ["run", "plugins", "eval", "sft", "reward"]


def test_help_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for cmd in COMMANDS:
        assert cmd in out


@pytest.mark.parametrize("cmd", COMMANDS)
def test_each_command_has_help(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert f"armor {cmd}" in out and len(out) > 200


def test_print_config_applies_overrides(capsys):
    assert main(["run", "--print-config", "actor.lr=7e-6", "rollout.n=3"]) == 0
    out = capsys.readouterr().out
    assert "lr: 7.0e-06" in out and "'n': 3" in out  # YAML 1.1 quotes the key n (it reads as a boolean)


def test_config_error_is_one_line_with_exit_code_2(capsys):
    assert main(["run", "--print-config", "actor.lrr=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Did you mean 'actor.lr'" in err and "Traceback" not in err


def test_unknown_plugin_in_config_is_an_error(capsys):
    assert main(["run", "--print-config", "algorithm.adv_estimator=grpoo"]) == 2
    err = capsys.readouterr().err
    assert "algorithm.adv_estimator" in err and "Did you mean 'grpo'?" in err


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "armor_core.cli", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("armor ")


def test_overrides_may_follow_options(capsys):
    assert main(["run", "--print-config", "actor.lr=7e-6", "--dry-run", "rollout.top_k=5"]) == 0
    out = capsys.readouterr().out
    assert "lr: 7.0e-06" in out and "top_k: 5" in out
    with pytest.raises(SystemExit):
        main(["plugins", "actor.lr=1"])
