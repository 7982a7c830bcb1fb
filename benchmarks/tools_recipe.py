"""Does ``armor run recipe:tools`` meet its targets? The recipe with its tool, and the same recipe without it.

    python benchmarks/tools_recipe.py [--steps N] [--only with_tool|without_tool] [--keep DIR] [OVERRIDE ...]

Each variant is one ``armor run recipe:tools`` in a subprocess (the command a user types), with
``trainer.run_dir`` in a temporary directory. ``without_tool`` is the same recipe whose ``tools``
environment offers ``calculator`` instead of ``lookup``: the prompt's tools line names
``calculator``, a ``lookup`` call is told "unknown tool", and there is nothing to copy. From each run's ``metrics.jsonl`` it prints held-out
greedy success before training, at its best and after the last step, the wall seconds of the whole
command (start-up, validations and training), the largest rollout/trainer log-prob gap of any step
(``rollout/logprob_diff_max``: ``|log pi_train - log pi_rollout|`` over sampled tokens, before the
step's update), and the tool calls, tool errors and masked share of tokens per episode. Then the
targets: success up >= 25 points with the tool, within 5 points of its start without it, the gap
under 1e-3 on every step. Extra arguments are config overrides given to both runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = {
    "with_tool": [],
    "without_tool": [
        "rollout.multi_turn.environment_kwargs.tools=[armor_plugins.environments.builtin_tools:calculator]"
    ],
}


def _run(name: str, overrides: list[str], run_dir: Path) -> dict:
    cmd = ["armor", "run", "recipe:tools", f"trainer.run_dir={run_dir}", "trainer.loggers=[jsonl]", *overrides]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"name": name, "error": f"exit {proc.returncode}: " + " | ".join(tail)}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    val = [(r["step"], r["val/table_lookup/acc_greedy"]) for r in rows if "val/table_lookup/acc_greedy" in r]
    steps = [r for r in rows if "actor/pg_loss" in r]
    gaps = [r["rollout/logprob_diff_max"] for r in steps if "rollout/logprob_diff_max" in r]

    def mean(key: str) -> float:
        values = [r[key] for r in steps if key in r]
        return sum(values) / max(len(values), 1)

    return {
        "name": name,
        "curve": val,
        "before": val[0][1],
        "after": val[-1][1],
        "best": max(v for _, v in val),
        "wall_s": wall,
        "steps": len(steps),
        "gap_max": max(gaps) if gaps else float("nan"),
        "gap_steps": len(gaps),
        "tool_calls": mean("env/tool_calls"),
        "tool_errors": mean("env/tool_errors"),
        "masked_share": mean("env/masked_share"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=None, help="trainer.total_steps (default: the recipe's)")
    ap.add_argument("--only", choices=sorted(VARIANTS), default=None)
    ap.add_argument("--keep", default=None, help="keep the run directories under DIR")
    args, overrides = ap.parse_known_args()
    if args.steps:
        overrides.append(f"trainer.total_steps={args.steps}")
    root = Path(args.keep or tempfile.mkdtemp(prefix="tools_recipe_"))
    results = []
    for name, extra in VARIANTS.items():
        if args.only and name != args.only:
            continue
        res = _run(name, [*extra, *overrides], root / name)
        results.append(res)
        print(json.dumps(res), flush=True)
    print(
        "\n| variant | held-out success before | best | after | change (points) | steps | wall s | "
        "max log-prob gap (steps measured) | tool calls / episode | tool errors / episode | masked share |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        if "error" in r:
            print(f"| {r['name']} | run failed: {r['error']} |")
            continue
        print(f"| {r['name']} | {r['before']:.3f} | {r['best']:.3f} | {r['after']:.3f} | "
              f"{100 * (r['after'] - r['before']):+.1f} | {r['steps']} | {r['wall_s']:.0f} | "
              f"{r['gap_max']:.2e} ({r['gap_steps']}) | {r['tool_calls']:.2f} | {r['tool_errors']:.2f} | "
              f"{r['masked_share']:.3f} |")  # fmt: skip
    by = {r["name"]: r for r in results if "error" not in r}
    checks = []
    if "with_tool" in by:
        w = by["with_tool"]
        checks.append(("with the tool: success up >= 25 points", w["after"] - w["before"] >= 0.25))
        checks.append(("with the tool: under 10 minutes", w["wall_s"] < 600))
    if "without_tool" in by:
        o = by["without_tool"]
        checks.append(("without the tool: within 5 points of its start", abs(o["after"] - o["before"]) <= 0.05))
    for r in by.values():
        if r["gap_steps"]:  # measured on the rows that carry a gradient: none when every group scores alike
            checks.append((f"{r['name']}: log-prob gap < 1e-3 on every step", r["gap_max"] < 1e-3))
        else:
            print(f"not measured: {r['name']}'s log-prob gap (no step had a row with a nonzero advantage)")
    print()
    for what, ok in checks:
        print(f"{'met' if ok else 'NOT met'}: {what}")
    return 0 if all(ok for _, ok in checks) and len(by) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
