"""A third-party distribution, pip-installed for real, shows up in `armor plugins` and in config validation."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # see [tool.pytest.ini_options] markers

DIST = "armor-test-thirdparty"
MODULE = "armor_test_thirdparty"


@pytest.fixture()
def installed_dist(tmp_path):
    pkg = tmp_path / MODULE
    pkg.mkdir()
    (tmp_path / "pyproject.toml").write_text(
        textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{DIST}"
        version = "0.3.1"
        dependencies = ["armor-rl"]

        [project.entry-points.armor]
        thirdparty = "{MODULE}"
    """)
    )
    (pkg / "__init__.py").write_text(
        textwrap.dedent("""
        from armor_core import Verdict, hookimpl


        def compute_sign_advantage(token_level_rewards, response_mask, index):
            adv = token_level_rewards.sum(-1).sign().unsqueeze(-1) * response_mask
            return adv, adv


        class LossCeilingGuard:
            def __init__(self, ceiling=10.0):
                self.ceiling = ceiling

            def observe(self, stage, stats, step):
                loss = stats.get("loss", 0.0)
                return Verdict("skip", "loss too high", loss, self.ceiling) if loss > self.ceiling else Verdict()

            def state_dict(self):
                return {}

            def load_state_dict(self, state):
                pass


        @hookimpl
        def armor_register_advantage_estimators(register):
            register("sign", compute_sign_advantage)


        @hookimpl
        def armor_register_stability_guards(register):
            register("loss_ceiling", LossCeilingGuard)
    """)
    )
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-build-isolation", "-q", str(tmp_path)], check=True, capture_output=True
    )
    try:
        yield
    finally:
        subprocess.run([*pip, "uninstall", "-y", "-q", DIST], check=True, capture_output=True)


def _armor(*args):
    return subprocess.run([sys.executable, "-m", "armor_core.cli.main", *args], capture_output=True, text=True)


def test_installed_plugin_is_listed_and_usable(installed_dist):
    out = _armor("plugins", "--json")
    assert out.returncode == 0, out.stderr
    rows = {(r["kind"], r["name"]): r for r in json.loads(out.stdout)}
    for key in (("advantage_estimator", "sign"), ("stability_guard", "loss_ceiling")):
        assert (
            rows[key]["distribution"] == DIST
            and rows[key]["version"] == "0.3.1"
            and rows[key]["plugin"] == "thirdparty"
        )
    assert ("advantage_estimator", "grpo") in rows  # built-ins still there

    table = _armor("plugins")
    assert "loss_ceiling" in table.stdout and DIST in table.stdout

    ok = _armor(
        "run",
        "--print-config",
        "algorithm.adv_estimator=sign",
        "guard.guards=[{name: loss_ceiling, params: {ceiling: 5}}]",
    )
    assert ok.returncode == 0, ok.stderr

    blocked = subprocess.run(
        [sys.executable, "-m", "armor_core.cli.main", "plugins", "--json"],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "ARMOR_DISABLE_PLUGINS": "thirdparty"},
    )
    names = {r["name"] for r in json.loads(blocked.stdout)}
    assert "sign" not in names and "loss_ceiling" not in names


def test_uninstalled_plugin_is_gone(installed_dist):
    def listed():
        out = _armor("plugins", "--json")
        assert out.returncode == 0, out.stderr
        return {r["name"] for r in json.loads(out.stdout)}

    assert {"sign", "loss_ceiling"} <= listed()  # installed by the fixture
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "-q", DIST], check=True, capture_output=True)
    names = listed()
    assert "sign" not in names and "loss_ceiling" not in names and "grpo" in names  # no stale registry
    gone = _armor("run", "--print-config", "algorithm.adv_estimator=sign")
    assert gone.returncode == 2 and "unknown advantage_estimator 'sign'" in gone.stderr, gone.stderr
