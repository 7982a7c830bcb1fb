"""armor-rl alone runs its own default: ``armor run`` with every reward pack hidden trains a few steps,
validates and prints its held-out accuracy; a recipe that needs a pack says which one to install.

The packs are hidden in each subprocess (and in the Ray workers it starts) twice over: their entry
points are blocked with ``ARMOR_DISABLE_PLUGINS``, and a ``sitecustomize`` on ``PYTHONPATH`` makes any
``import armor_rewards_*`` fail, so a stray import of a pack fails the run instead of passing unseen.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from armor_core.plugins import DISABLE_ENV

pytestmark = pytest.mark.slow

BLOCKER = textwrap.dedent(
    """
    import importlib.abc, sys

    class _NoPacks(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0].startswith("armor_rewards_"):
                raise ImportError(f"{name} is hidden: this test runs armor-rl without its reward packs")
            return None

    sys.meta_path.insert(0, _NoPacks())
    """
)


@pytest.fixture(scope="module")
def core_alone_env(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(BLOCKER, encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env[DISABLE_ENV] = "math,qa,safety,code"
    return env


def _armor(env, cwd, *args, timeout=600):
    return subprocess.run(
        [sys.executable, "-m", "armor_core.cli", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_packs_are_really_hidden(core_alone_env, tmp_path):
    probe = subprocess.run(
        [sys.executable, "-c", "import armor_rewards_math"], env=core_alone_env, capture_output=True, text=True
    )
    assert probe.returncode != 0 and "is hidden" in probe.stderr
    listed = _armor(core_alone_env, tmp_path, "plugins")
    assert listed.returncode == 0, listed.stderr
    assert "arithmetic" in listed.stdout and "gsm8k" not in listed.stdout and "multiple_choice" not in listed.stdout


def test_the_default_run_trains_and_validates_without_any_pack(core_alone_env, tmp_path):
    out = _armor(
        core_alone_env,
        tmp_path,
        "run",
        "trainer.total_steps=3",
        "data.val_size=32",
        "trainer.loggers=[jsonl]",
        f"trainer.run_dir={tmp_path / 'run'}",
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "accuracy" in (out.stdout + out.stderr).lower()
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("val/acc_greedy") >= 2  # before and after


def test_a_recipe_needing_a_pack_names_the_pip_install(core_alone_env, tmp_path):
    out = _armor(core_alone_env, tmp_path, "run", "recipe:cross_domain", timeout=120)
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].endswith("pip install armor-rewards-qa"), out.stderr
