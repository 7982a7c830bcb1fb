"""The `armor` command line: help for every command, and errors printed as one clear line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from armor_core.cli.main import main
from armor_core.testing.damage import add_own_code, flipped_checkpoint, write_adapter

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


# -- user errors from every command, as a user's shell sees them ---------------------------------------


def _builtin_copy(tmp_path, name="model"):
    import shutil

    from armor_core.models.loading import resolve_model_path

    return shutil.copytree(resolve_model_path("builtin:arithmetic-tiny"), tmp_path / name)


def _truncated_adapter(tmp_path):
    weights = write_adapter(tmp_path / "adapter") / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    return tmp_path / "adapter"


def _bad_adapter_config(tmp_path):
    adapter = write_adapter(tmp_path / "adapter")
    (adapter / "adapter_config.json").write_text('{"r": 2,')
    return adapter


def _own_code(tmp_path):
    model = _builtin_copy(tmp_path)
    add_own_code(model)
    return model


def _a_file(tmp_path):
    (tmp_path / "notes.txt").write_text("a file, not a directory")
    return tmp_path / "notes.txt"


def _data_dir(tmp_path):
    (tmp_path / "data").mkdir()
    return tmp_path / "data"


def _nan_model(tmp_path):
    """A model directory with one NaN weight, as a diverged run leaves it."""
    from safetensors.torch import load_file, save_file

    model = _builtin_copy(tmp_path, "nan_model")
    tensors = load_file(model / "model.safetensors")
    tensors[sorted(tensors)[0]].view(-1)[0] = float("nan")
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    return model


_EVAL = ["--data", "task:arithmetic", "--size", "2"]

COMMAND_ERRORS = {
    "plugins: an unknown kind": (lambda tmp: ["plugins", "--kind", "nosuch"], r"--kind nosuch: no such kind"),
    "sft: --out names a file": (
        lambda tmp: ["sft", "--init", "tiny-qwen2", "--out", str(_a_file(tmp)), "--steps", "1"],
        r"--out .*notes.txt is a file; give a directory",
    ),
    "sft: --data names a directory": (
        lambda tmp: ["sft", "--init", "tiny-qwen2", "--data", str(_data_dir(tmp)), "--out", str(tmp / "o")],
        r"--data file '.*data' is a directory; give a JSONL file",
    ),
    "sft: --data names a missing file": (
        lambda tmp: ["sft", "--init", "tiny-qwen2", "--data", str(tmp / "nowhere.jsonl"), "--out", str(tmp / "o")],
        r"--data file '.*nowhere.jsonl' does not exist",
    ),
    "sft: a truncated model": (
        lambda tmp: ["sft", "--model", _truncated_model(tmp)[0].split("=", 1)[1], "--out", str(tmp / "o")],
        r"model/model.safetensors: tensor '.*' ends at byte",
    ),
    "eval: a truncated adapter": (
        lambda tmp: ["eval", str(_truncated_adapter(tmp)), *_EVAL],
        r"adapter/adapter_model.safetensors",
    ),
    "eval: a bad adapter_config.json": (
        lambda tmp: ["eval", str(_bad_adapter_config(tmp)), *_EVAL],
        r"adapter/adapter_config.json is not valid JSON",
    ),
    "eval: --max-new-tokens 0": (
        lambda tmp: ["eval", "builtin:arithmetic-tiny", *_EVAL, "--max-new-tokens", "0"],
        r"--max-new-tokens 0: a response needs at least 1 token",
    ),
    "eval: a model directory that needs its own code": (
        lambda tmp: ["eval", str(_own_code(tmp)), *_EVAL],
        r"modeling_probe.py.*set model.trust_remote_code=true \(armor eval.*--trust-remote-code\)",
    ),
    "eval: a checkpoint whose weights fail the manifest": (
        lambda tmp: ["eval", str(flipped_checkpoint(tmp / "run") / "model"), *_EVAL],
        r"step_000001 is damaged: model/model.safetensors does not match the sha256",
    ),
    "eval: a checkpoint's adapter that fails the manifest": (
        lambda tmp: ["eval", str(flipped_checkpoint(tmp / "run", lora=True) / "adapter"), *_EVAL],
        r"step_000001 is damaged: adapter/adapter_model.safetensors does not match the sha256",
    ),
    "eval: a NaN in the weights": (
        lambda tmp: ["eval", str(_nan_model(tmp)), *_EVAL],
        r"nan_model/model.safetensors: tensor '.+' holds 1 NaN or inf value",
    ),
    "sft: a NaN in the weights": (
        lambda tmp: ["sft", "--model", str(_nan_model(tmp)), "--out", str(tmp / "o"), "--steps", "1"],
        r"nan_model/model.safetensors: tensor '.+' holds 1 NaN or inf value",
    ),
    "export: a checkpoint whose weights fail the manifest": (
        lambda tmp: ["export", str(flipped_checkpoint(tmp / "run")), str(tmp / "out")],
        r"step_000001 is damaged: model/model.safetensors does not match the sha256",
    ),
    "export --merge: a damaged adapter": (
        lambda tmp: ["export", str(flipped_checkpoint(tmp / "run", lora=True)), str(tmp / "out"), "--merge"],
        r"step_000001 is damaged: adapter/adapter_model.safetensors does not match the sha256",
    ),
    "run: a self-referential interpolation": (
        lambda tmp: ["run", "--print-config", "trainer.run_dir=${trainer.run_dir}"],
        r"trainer.run_dir: Recursive interpolation detected",
    ),
    "run: more cores per worker than the machine has": (
        lambda tmp: ["run", "engine.cpus_per_worker=4096", f"trainer.run_dir={tmp / 'run'}"],
        r"not enough CPU cores: .*Lower engine.cpus_per_worker",
    ),
    "run: more workers than cores": (
        lambda tmp: ["run", "actor.num_workers=16", "engine.cpus_per_worker=1", f"trainer.run_dir={tmp / 'run'}"],
        r"not enough CPU cores: 16 workers .*run fewer workers",
    ),
    "run: a GPU per worker where none is visible": (
        lambda tmp: ["run", "engine.gpus_per_worker=1", f"trainer.run_dir={tmp / 'run'}"],
        r"not enough GPUs: .*Lower engine.gpus_per_worker",
    ),
    "run: trainer.run_dir naming a file": (
        lambda tmp: ["run", f"trainer.run_dir={_a_file(tmp)}"],
        r"trainer.run_dir=.*notes.txt is not a directory; give a directory",
    ),
    "run: a tracker named twice": (
        lambda tmp: ["run", "--dry-run", "trainer.loggers=[jsonl,jsonl]", f"trainer.run_dir={tmp / 'run'}"],
        r"trainer.loggers=\['jsonl', 'jsonl'\] names jsonl more than once",
    ),
    "run: a directory as a data file": (
        lambda tmp: ["run", "--dry-run", f"data.train_files=[{_data_dir(tmp)}]", f"trainer.run_dir={tmp / 'run'}"],
        r"data file '.*data' is a directory",
    ),
    "new: a name whose module is ARMOR's": (
        lambda tmp: ["new", "guard", "core", "--out", str(tmp)],
        r"its module 'armor_core' is already importable",
    ),
    "new: an overlong name": (lambda tmp: ["new", "guard", "a" * 300, "--out", str(tmp)], r"has 300 characters"),
    "reward: an empty --ground-truth": (
        lambda tmp: ["reward", "math", "--response", "\\boxed{2}", "--ground-truth", ""],
        r"domain 'math' requires --ground-truth \(got an empty one; training refuses such a row too\)",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(COMMAND_ERRORS))
def test_a_user_error_in_any_command_is_an_error_line_and_exit_code_2(tmp_path, case):
    """Each command as a user's shell runs it: exit 2, an `error:` line naming what is wrong, no traceback."""
    import os
    import re

    make, pattern = COMMAND_ERRORS[case]
    argv = make(tmp_path)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # the GPU row means "none visible" on any machine
    out = subprocess.run(
        [sys.executable, "-m", "armor_core.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    errors = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(errors) == 1, out.stderr[-3000:]
    assert re.search(pattern, errors[0]), errors[0]


def test_code_that_calls_sys_exit_during_a_command_is_one_line_and_exit_2(monkeypatch, capsys):
    # a plugin or reward file that calls sys.exit(0) while `armor run` runs must not end it as a success
    import armor_core.loop.preflight as preflight

    def exits(cfg, pm=None):
        raise SystemExit(0)

    monkeypatch.setattr(preflight, "check_run", exits)
    assert main(["run", "--dry-run", "trainer.total_steps=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: armor run: code it ran raised SystemExit(0) at ")


def test_a_multi_turn_typo_fails_the_dry_run_in_one_line(capsys):
    # it passed --dry-run and failed with a traceback once the workers had started
    tools = "rollout.multi_turn.environment_kwargs={tools: ['armor_plugins.environments.builtin_tools:calculator']}"
    argv = ["run", "--dry-run", "rollout.multi_turn.enable=true", tools, "rollout.multi_turn.parser=hermez"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown parser 'hermez'. Did you mean 'hermes'?" in err[0]
