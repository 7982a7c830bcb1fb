"""The `armor` command line: help for every command, and errors printed as one clear line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from armor_core.cli.main import main

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
    out = subprocess.run([sys.executable, "-m", "armor_core.cli.main", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("armor ")


def test_overrides_may_follow_options(capsys):
    assert main(["run", "--print-config", "actor.lr=7e-6", "--dry-run", "rollout.top_k=5"]) == 0
    out = capsys.readouterr().out
    assert "lr: 7.0e-06" in out and "top_k: 5" in out
    with pytest.raises(SystemExit):
        main(["plugins", "actor.lr=1"])


# -- user errors from `armor run`, as a user's shell sees them ----------------------------------------


def _truncated_model(tmp_path):
    import shutil

    from armor_core.models.loading import resolve_model_path

    model = tmp_path / "model"
    shutil.copytree(resolve_model_path("builtin:arithmetic-tiny"), model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:6000])
    return [f"model.path={model}"]


def _run_dir_with_a_checkpoint(tmp_path):
    from armor_core.storage.checkpoint import CheckpointManager

    CheckpointManager(tmp_path / "run").save(1, lambda d: (d / "w.bin").write_bytes(b"w"), {"step": 1})
    return []


USER_ERRORS = {
    "run directory holds checkpoints": (
        _run_dir_with_a_checkpoint,
        r"run already holds checkpoints; pass --resume to continue that run",
    ),
    "guard parameter refused": (
        lambda tmp: ["guard.guards=[{name: grad_spike, params: {window: 0}}]"],
        r"guard.guards\[0\]: .*window=0 must be >= 1",
    ),
    "unknown guard parameter": (
        lambda tmp: ["guard.guards=[{name: entropy, params: {flor: 1}}]"],
        r"guard.guards\[0\] \(entropy\): .*unexpected keyword argument 'flor'",
    ),
    "override that is not YAML": (
        lambda tmp: ["guard.guards=[{name:grad_spike,params:{window:0}}]"],
        r"override 'guard.guards=.*': the value is not valid YAML",
    ),
    "task parameter refused": (
        lambda tmp: ["data.task_kwargs={digits: 0}"],
        r"data.task=arithmetic with data.task_kwargs=\{'digits': 0\}: .*digits=0",
    ),
    "damaged model weights": (
        _truncated_model,
        r"model/model.safetensors: tensor '.*' ends at byte \d+ of the data, but the file holds only",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(USER_ERRORS))
def test_a_user_error_is_one_line_and_exit_code_2_without_a_traceback(tmp_path, case):
    import re

    make, pattern = USER_ERRORS[case]
    args = [*make(tmp_path), f"trainer.run_dir={tmp_path / 'run'}"]
    out = subprocess.run(
        [sys.executable, "-m", "armor_core.cli.main", "run", *args], capture_output=True, text=True, timeout=300
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("error: ") and re.search(pattern, lines[0]), lines[0]
