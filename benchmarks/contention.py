"""Seconds per step of the default run alone and beside a one-core busy loop, for each OpenMP wait
policy of the workers (``engine.omp_wait_policy``): what another process on the same cores costs.

    python benchmarks/contention.py              # about 5 minutes on 2 cores
    python benchmarks/contention.py --steps 40

Each cell is one ``armor run trainer.total_steps=STEPS trainer.val_freq=0`` in a subprocess, timed by
the run itself (its "seconds per step" line, which leaves out start-up). The busy loop is a second
Python process spinning on one core for the whole run, as another job would. ``auto`` measures the
cores' load as the run starts and picks ``passive`` when other processes keep half a core busy.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ARMOR = [sys.executable, "-m", "armor_core.cli.main", "run"]


def seconds_per_step(policy: str, steps: int, run_dir: Path) -> tuple[float, str]:
    out = subprocess.run(
        [*ARMOR, f"trainer.total_steps={steps}", "trainer.val_freq=0", f"trainer.run_dir={run_dir}",
         f"engine.omp_wait_policy={policy}"],
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    if out.returncode:
        raise SystemExit(f"armor run failed ({out.returncode}): {out.stderr[-2000:]}")
    step = re.search(r"seconds per step by stage: step ([0-9.]+)", out.stdout)
    chose = "passive" if "OpenMP threads sleep" in out.stdout else ("active" if policy == "auto" else policy)
    return float(step.group(1)), chose


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for load in ("alone", "busy loop"):
            busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load == "busy loop" else None
            try:
                for policy in ("active", "passive", "auto"):
                    s, chose = seconds_per_step(policy, args.steps, Path(tmp) / f"{load}-{policy}".replace(" ", "_"))
                    rows.append((load, policy, chose, s))
            finally:
                if busy is not None:
                    busy.kill()
    alone = {policy: s for load, policy, _, s in rows if load == "alone"}
    print("| cores | engine.omp_wait_policy | chosen | s/step | vs active alone |")
    print("|---|---|---|---|---|")
    for load, policy, chose, s in rows:
        print(f"| {load} | {policy} | {chose} | {s:.3f} | {s / alone['active']:.1f}x |")


if __name__ == "__main__":
    main()
