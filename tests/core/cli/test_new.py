"""``armor new``: the generated packages install, pass their own tests and show in ``armor plugins``;
names are checked; ``armor_core.testing.check_guard`` holds guards to the contract."""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import subprocess
import sys

import pytest

from armor_core import Verdict, hookimpl, hookspecs, interfaces
from armor_core.cli.main import main
from armor_core.cli.new import KINDS, write_plugin
from armor_core.cli.new_adapter import write_adapter
from armor_core.config.schema import load_config
from armor_core.errors import UserFacingError
from armor_core.testing import check_guard, registered

GENERATED = {"guard": "spike_cap", "reward": "last_word", "estimator": "group_centered", "environment": "number_guess"}
#: ``armor new environment NAME --adapter A``: the package's name, and the built-in environment its config plays
ADAPTED = {"gym": ("word_game", "gym_text"), "textarena": ("guess_game", "textarena"), "mcp": ("table_tools", "tools")}


def _run(*args: str, cwd=None, timeout: int = 300, path: str | None = None) -> str:
    env = (
        None
        if path is None
        else {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [path, os.environ.get("PYTHONPATH")]))}
    )
    out = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert out.returncode == 0, f"{' '.join(args)} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


@pytest.mark.slow
def test_each_generated_package_passes_its_test_and_is_listed_after_pip_install(tmp_path):
    """The packages are installed into a folder of their own, on the path of this test's commands only: a test
    must not change the environment it runs in (another process using it would find plugins come and go)."""
    assert [main(["new", kind, name, "--out", str(tmp_path)]) for kind, name in GENERATED.items()] == [0] * 4
    adapted = [
        main(["new", "environment", name, "--adapter", a, "--out", str(tmp_path)]) for a, (name, _) in ADAPTED.items()
    ]
    assert adapted == [0] * 3
    names = [*GENERATED.values(), *(name for name, _ in ADAPTED.values())]
    dirs = [tmp_path / f"armor-{name.replace('_', '-')}" for name in names]
    assert all((d / "pyproject.toml").is_file() and (d / "README.md").is_file() for d in dirs)
    site = tmp_path / "site-packages"
    _run(
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "--target",
        str(site),
        *map(str, dirs),
    )
    report = _run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *(str(d / "tests") for d in dirs),
                  cwd=tmp_path, path=str(site))  # fmt: skip
    assert "18 passed" in report  # the adapters' tests: their config checked as armor run does, a game, an MCP call
    listed = json.loads(_run(sys.executable, "-m", "armor_core.cli.main", "plugins", "--json", path=str(site)))
    ours = {(e["kind"], e["name"], e["distribution"]) for e in listed if e["name"] in GENERATED.values()}
    assert ours == {(KINDS[k].plugin_kind, n, f"armor-{n.replace('_', '-')}") for k, n in GENERATED.items()}
    # the generated environment, installed and untouched, drives a training run's episodes
    run_dir = tmp_path / "env-run"
    _run(sys.executable, "-m", "armor_core.cli.main", "run", "trainer.total_steps=2", "data.train_size=32",
         "data.val_size=8", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=4",
         "rollout.max_new_tokens=4", "rollout.multi_turn.enable=true", "rollout.multi_turn.environment=number_guess",
         "rollout.multi_turn.max_turns=3", "trainer.loggers=[jsonl]", "engine.cpus_per_worker=1",
         f"trainer.run_dir={run_dir}", timeout=600, path=str(site))  # fmt: skip
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2] and all(1.0 <= r["env/turns"] <= 3.0 for r in steps)
    listed = json.loads(_run(sys.executable, "-m", "armor_core.cli.main", "plugins", "--json"))
    assert not [e for e in listed if e["name"] in GENERATED.values()]  # the environment itself never saw them


@pytest.mark.parametrize("adapter", sorted(ADAPTED))
def test_an_adapter_package_registers_nothing_and_its_config_and_readme_snippet_load(tmp_path, adapter):
    import tomllib

    name, environment = ADAPTED[adapter]
    package = write_adapter(name, adapter, tmp_path)
    assert "entry-points" not in tomllib.loads((package / "pyproject.toml").read_text())["project"]
    snippet = re.search(r"```yaml\n(.*?)```", (package / "README.md").read_text(), re.S)
    assert snippet is not None
    (tmp_path / "snippet.yaml").write_text(snippet.group(1))
    for config in (package / "config.yaml", tmp_path / "snippet.yaml"):
        mt = load_config(config).rollout.multi_turn
        assert mt.enable and mt.environment == environment
    if adapter == "gym":
        assert mt.environment_kwargs["factory"] == f"armor_{name}.game:make"


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["environment", "x", "--adapter", "gymnasium"],
            "unknown --adapter 'gymnasium'; choose one of gym, textarena, mcp",
        ),
        (["reward", "x", "--adapter", "gym"], "armor new reward: --adapter applies only to `armor new environment`"),
        (
            ["environment", "x", "--adapter", "gym", "--env-id", "Sudoku-v0"],
            "--env-id applies only to `--adapter textarena`",
        ),
        (["environment", "x", "--adapter", "textarena", "--env-id", "Sudoku-v9"], "textarena has no game 'Sudoku-v9'"),
    ],
)
def test_a_bad_adapter_is_one_line_and_writes_nothing(tmp_path, capsys, argv, message):
    assert main(["new", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_module_docstring_is_the_installed_contract(tmp_path, kind):
    module = write_plugin(kind, "probe", tmp_path) / "armor_probe" / "__init__.py"
    doc = ast.get_docstring(ast.parse(module.read_text()))
    spec = KINDS[kind]
    assert inspect.getdoc(getattr(hookspecs, spec.hook)) in doc
    for name in spec.types:
        assert inspect.getdoc(getattr(interfaces, name)) in doc
    if kind == "guard":
        for name, stage in interfaces.GUARD_STAGES.items():
            # where it runs, and what its verdicts do, as the table says (the text is wrapped: compare words)
            words = " ".join(doc.split())
            assert f"``{name}`` ({stage.where})" in words
            assert all(" ".join(what.split()) in words for what in stage.honours.values())


@pytest.mark.parametrize(
    "name, message",
    [
        ("Bad-Name", r"'Bad-Name' is not lowercase snake_case.*Try 'bad_name'$"),
        ("2fast", "'2fast' is not lowercase snake_case"),
        ("class", "'class' is not lowercase snake_case"),
        ("_", r"'_' is not lowercase snake_case.*, e\.g\. my_guard$"),  # armor-- is no PEP 508 name
        ("x__y", r"'x__y' is not lowercase snake_case.*Try 'x_y'$"),  # armor-x--y normalises to armor-x-y
        ("Grad-Spike", r"'Grad-Spike' is not lowercase snake_case.*, e\.g\. my_guard$"),  # grad_spike is taken
        ("a" * 300, r"has 300 characters; at most 64"),
        ("grad_spike", "the entry point 'grad_spike' is already installed"),
        ("rl", r"its distribution 'armor-rl' is already installed \(armor-rl "),
        ("rewards_math", r"its distribution 'armor-rewards-math' is already installed"),
        ("core", r"its module 'armor_core' is already importable"),
    ],
)
def test_a_name_that_cannot_be_a_plugin_name_is_refused(tmp_path, name, message):
    with pytest.raises(UserFacingError, match=message):
        write_plugin("guard", name, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_module_that_is_importable_without_a_distribution_is_refused(tmp_path, monkeypatch):
    (tmp_path / "lib" / "armor_lonely").mkdir(parents=True)
    (tmp_path / "lib" / "armor_lonely" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    with pytest.raises(UserFacingError, match=r"its module 'armor_lonely' is already importable \(.*lib"):
        write_plugin("reward", "lonely", tmp_path / "out")


@pytest.mark.parametrize("name", ["_", "class", "a" * 300])
def test_no_suggestion_is_the_refused_name_and_the_command_exits_2_without_a_traceback(tmp_path, capsys, name):
    assert main(["new", "guard", name, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    suggested = re.findall(r"Try '([^']*)'", err)
    assert name not in suggested
    for other in suggested:  # a suggestion is itself accepted
        assert write_plugin("guard", other, tmp_path / "ok").is_dir()


def test_an_out_that_is_a_file_is_an_error_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert main(["new", "guard", "mine", "--out", str(tmp_path / "file")]) == 2
    assert "cannot write" in capsys.readouterr().err and sorted(tmp_path.iterdir()) == [tmp_path / "file"]


def test_a_registered_name_or_an_existing_directory_is_refused(tmp_path, capsys):
    class Registered:
        @hookimpl
        def armor_register_reward_domains(self, register):
            register("taken", lambda prompt, response, ground_truth, extra: 0.0)

    with (
        registered(Registered()),
        pytest.raises(UserFacingError, match="a reward_domain named 'taken' is already registered"),
    ):
        write_plugin("reward", "taken", tmp_path)
    (tmp_path / "armor-mine").mkdir()
    assert main(["new", "reward", "mine", "--out", str(tmp_path)]) == 2
    assert "armor-mine already exists; nothing was written" in capsys.readouterr().err
    assert list((tmp_path / "armor-mine").iterdir()) == []


# -- check_guard ----------------------------------------------------------------------------------------


def test_check_guard_passes_every_installed_guard():
    from armor_core.plugins import get_plugin_manager

    pm = get_plugin_manager()
    for name in pm.names("stability_guard"):
        check_guard(pm.get("stability_guard", name))
    verdicts = check_guard(pm.get("stability_guard", "non_finite"))
    # the NaN round: skipped where the update can still be held back; after it, nothing to skip yet
    assert {stage: v.action for stage, step, v in verdicts if step == 21} == {
        "reward": "skip",
        "advantage": "skip",
        "grad": "skip",
        "update": "proceed",
        "validation": "proceed",
    }


class _Counting:
    """Skips every third update; the count is its state."""

    stages = ("grad",)

    def __init__(self, keep_state: bool = True, adjust: str = "") -> None:
        self.n, self.keep_state, self.adjust = 0, keep_state, adjust

    def observe(self, stage, stats, step):
        self.n += 1
        if self.adjust:
            return Verdict("adjust", adjustments={self.adjust: 0.1})
        return Verdict("skip", f"update {self.n}") if self.n % 3 == 0 else Verdict.proceed()

    def state_dict(self):
        return {"n": self.n if self.keep_state else 0}

    def load_state_dict(self, state):
        self.n = state["n"]


class _LateSkip(_Counting):
    """Skips every third time it is shown a stage, also at ``update``, where the update is already made."""

    stages = ("grad", "update")


def test_check_guard_fails_a_guard_whose_verdict_its_stage_cannot_honour():
    with pytest.raises(AssertionError, match=r"_LateSkip.observe\('update', .*'skip' at stage 'update', which that"):
        check_guard(_LateSkip)
    declared = type("Declared", (_LateSkip,), {"actions": {"grad": ("skip",), "update": ("skip",)}})
    with pytest.raises(AssertionError, match=r"^Declared.actions declares 'skip' at stage 'update'"):
        check_guard(declared)  # refused before a single observation, as GuardRunner refuses it at build time
    undeclared = type("Undeclared", (_Counting,), {"actions": {"grad": ("scale",)}})
    with pytest.raises(AssertionError, match="returned 'skip' at stage 'grad', but Undeclared.actions declares scale"):
        check_guard(undeclared)
    check_guard(type("Honest", (_Counting,), {"actions": {"grad": ("skip",)}}))


def test_check_guard_catches_lost_state_and_unknown_coefficients():
    verdicts = check_guard(_Counting)
    assert [v.action for _, _, v in verdicts].count("skip") == len(verdicts) // 3
    with pytest.raises(AssertionError, match="an instance restored from state_dict"):
        check_guard(_Counting, keep_state=False)
    with pytest.raises(AssertionError, match=r"adjusts \['temperature'\]"):
        check_guard(_Counting, adjust="temperature")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_printed_next_step_installs_pytest_with_the_package(tmp_path, capsys, kind):
    import tomllib

    assert main(["new", kind, "probe_next", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "&& pip install -e '.[test]' && python -m pytest &&" in printed  # `pip install -e .` has no pytest
    package = tmp_path / "armor-probe-next"
    extras = tomllib.loads((package / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("pytest") for req in extras["test"])
    assert "pip install -e '.[test]'" in (package / "README.md").read_text()
