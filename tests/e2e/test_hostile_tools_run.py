"""``armor run`` with a tool that calls ``sys.exit(0)`` or never returns (recipe:tools, its ``lookup`` replaced,
two tiny steps): the run goes on to the end, exit 0 with ``summary.json``, and every call the policy made came
back as an error it read. A tool's ``sys.exit(0)`` used to end the run at step 1 with exit 0, no summary and an
empty ``metrics.jsonl``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = '''
import sys
import threading


def lookup(key: str, *, table: dict | None = None) -> str:
    """Read the value stored under a key.

    Args:
        key: the key to read, e.g. "alpha".
    """
    if key[:1] < "m":
        sys.exit(0)  # argparse's way out, or a careless tool's
    threading.Event().wait()  # never returns
'''


def test_a_run_whose_tool_exits_or_hangs_finishes_with_every_call_an_error(tmp_path):
    (tmp_path / "hostile_tools.py").write_text(HOSTILE)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "armor_core.cli.main",
            "run",
            "recipe:tools",
            "rollout.multi_turn.environment_kwargs={tools: ['hostile_tools:lookup'], timeout_s: 1}",
            "data.train_size=16",
            "data.val_size=8",
            "data.train_batch_size=2",
            "actor.ppo_mini_batch_size=2",
            "rollout.n=2",
            "trainer.total_steps=2",
            "trainer.val_freq=0",
            "trainer.val_before_train=false",
            "trainer.loggers=[jsonl]",
            f"trainer.run_dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "CUDA_VISIBLE_DEVICES": ""},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run_dir / "summary.json").exists()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "actor/pg_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:  # the warm start calls lookup; each call is an error it reads, and its episodes end as usual
        assert r["env/tool_calls"] > 0 and r["env/tool_errors"] == r["env/tool_calls"]
        assert r["env/ended_env_error"] == 0.0
