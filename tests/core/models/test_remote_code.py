"""A model directory's own Python code runs only when the user allows it (``model.trust_remote_code``)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from armor_core.loop.preflight import check_model
from armor_core.models.loading import ModelPathError, load_model, load_tokenizer, resolve_model_path
from armor_core.models.remote_code import runs_directory_code
from armor_core.testing.damage import add_own_code

ROOT = Path(__file__).resolve().parents[3]


def _copy(tmp_path: Path, name: str = "model") -> Path:
    d = tmp_path / name
    shutil.copytree(resolve_model_path("builtin:arithmetic-tiny"), d)
    return d


def test_a_directory_only_its_own_code_can_load_is_refused_without_running_it(tmp_path):
    d = _copy(tmp_path)
    marker = add_own_code(d)
    for load in (load_model, lambda p: check_model(str(p))):
        with pytest.raises(
            ModelPathError, match=r"configuration_probe\.py, modeling_probe\.py.*model.trust_remote_code=true"
        ):
            load(d)
    assert not marker.exists()


def test_a_directory_transformers_knows_loads_with_transformers_classes_and_its_code_is_not_run(tmp_path):
    d = _copy(tmp_path)
    marker = add_own_code(d, native=True)  # as DeepSeek-V3 checkpoints: model_type known, code shipped too
    model = load_model(d)
    check_model(str(d))
    assert type(model).__name__ == "Qwen2ForCausalLM" and not runs_directory_code(model)
    assert not marker.exists()


def test_a_tokenizer_only_its_own_code_can_load_is_refused(tmp_path):
    d = _copy(tmp_path)
    config = json.loads((d / "tokenizer_config.json").read_text())
    config.update(
        tokenizer_class="ProbeTokenizer", auto_map={"AutoTokenizer": ["tokenization_probe.ProbeTokenizer", None]}
    )
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelPathError, match=r"tokenizer_config.json names Python code.*tokenization_probe\.py"):
        load_tokenizer(d)


def test_with_the_option_the_directory_code_runs(tmp_path):
    """In subprocesses: transformers caches the code under HF_MODULES_CACHE, read when it is imported."""
    d = _copy(tmp_path)
    marker = add_own_code(d)
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules")}
    cli = [sys.executable, "-m", "armor_core.cli.main", "eval", str(d), "--data", "task:arithmetic", "--size", "2"]
    refused = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=300)
    assert refused.returncode == 2 and not marker.exists(), refused.stderr[-2000:]
    allowed = subprocess.run([*cli, "--trust-remote-code"], capture_output=True, text=True, env=env, timeout=300)
    assert allowed.returncode == 0 and marker.exists(), allowed.stderr[-2000:]
    code = (
        "from armor_core.models.loading import load_model\n"
        "from armor_core.models.remote_code import runs_directory_code\n"
        f"print(runs_directory_code(load_model({str(d)!r}, trust_remote_code=True)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.split()[-1] == "True", out.stderr[-2000:]


def _calls(tree: ast.AST, names: set[str]) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in names
    ]


def test_every_transformers_load_in_the_code_passes_trust_remote_code():
    """transformers asks y/N (and then runs the code) when trust_remote_code is left out."""
    missing, seen = [], 0
    packages = [ROOT / "armor_core", ROOT / "armor_plugins", *sorted(ROOT.glob("armor_rewards_*/armor_rewards_*"))]
    assert len(packages) >= 4  # the reward packs ship in this repository too
    for package in packages:
        for f in sorted(package.rglob("*.py")):
            tree = ast.parse(f.read_text())
            for call in _calls(tree, {"from_pretrained", "from_config"}):
                owner = ast.unparse(call.func.value)
                if owner == "PeftModel":  # peft runs no code from the adapter directory and takes no such option
                    continue
                if call.func.attr == "from_config" and not owner.startswith("Auto"):
                    continue  # only transformers' Auto classes run the code a config's auto_map names
                seen += 1
                if not any(k.arg == "trust_remote_code" for k in call.keywords):
                    missing.append(f"{f.relative_to(ROOT)}:{call.lineno} {owner}.{call.func.attr}")
    assert seen >= 4 and not missing, missing
