"""Synchronous against asynchronous rollout on the built-in task: steps per second, time to a target
accuracy, final accuracy.

    python benchmarks/async.py                      # 250 steps per run, about 5 minutes on 2 cores
    python benchmarks/async.py --steps 100 --seeds 0 1 --target 0.65 --staleness 1 2
    python benchmarks/async.py --filter-groups        # also sync with dynamic sampling (DAPO)

Runs, each the default job (``armor run``: the shipped tiny Qwen2, two-number addition, GRPO,
16 prompts x 8 samples) through the whole trainer, same seeds:

- ``sync``: one actor worker on every core (``--cores``, default 2), generating and training in turn
  (the default run, ``trainer.overlap_generation`` on);
- ``async sN``: one actor worker and one rollout worker, half the cores each, the rollout worker
  generating up to N batches ahead (``rollout.max_staleness=N``), with ``algorithm.rollout_correction``
  (``--correction``, default ``tis_token``);
- ``sync filter`` (``--filter-groups``): ``sync`` with ``algorithm.filter_groups=true``: groups
  that all scored alike are replaced by further generated ones.

Steps per second counts the training loop only (the sum of ``timing_s/step``: no start-up, no
validation). "no-signal rows" is the share of trained rows whose advantages are all 0
(``actor/zero_adv_rows``: a GRPO group that scored all alike), the work a step wastes. Held-out greedy accuracy is
measured every ``--val-freq`` steps; "time to target" is
the loop time until the first validation at or above ``--target``. Printed: one row per run and
seed, then the mean per configuration.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path


def run(run_dir: Path, overrides: list[str], target: float) -> dict:
    from armor_core.config.schema import load_config
    from armor_core.loop.trainer import Trainer

    trainer = Trainer(load_config(None, [*overrides, f"trainer.run_dir={run_dir}", "trainer.loggers=[jsonl]"]))
    try:
        summary = trainer.fit()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    loop_s, reached = 0.0, None
    for r in rows:
        loop_s += r.get("timing_s/step", 0.0)
        if reached is None and r.get("val/acc_greedy", -1.0) >= target and "timing_s/step" in r:
            reached = loop_s
    steps = [r for r in rows if "timing_s/step" in r]
    if reached is None and summary["val_after"].get("val/acc_greedy", -1.0) >= target:
        reached = loop_s
    return {
        "steps_per_s": len(steps) / loop_s,
        "to_target_s": reached,
        "before": summary["val_before"]["val/acc_greedy"],
        "after": summary["val_after"]["val/acc_greedy"],
        "staleness": statistics.mean(r.get("rollout/staleness_mean", 0.0) for r in steps),
        "gen_wait_s": statistics.mean(r.get("timing_s/gen", 0.0) for r in steps),
        "update_s": statistics.mean(r.get("timing_s/update_actor", 0.0) for r in steps),
        "zero_adv": statistics.mean(r.get("actor/zero_adv_rows", 0.0) for r in steps),
        "weights_s": statistics.mean(r.get("timing_s/update_weights", 0.0) for r in steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--cores", type=int, default=2, help="cores for the run: the sync worker has them all, async splits them"
    )
    parser.add_argument(
        "--staleness", type=int, nargs="*", default=[1], help="rollout.max_staleness values to run (none: no async run)"
    )
    parser.add_argument("--correction", default="tis_token", help="algorithm.rollout_correction in the async runs")
    parser.add_argument("--target", type=float, default=0.68, help="held-out greedy accuracy for 'time to target'")
    parser.add_argument("--val-freq", type=int, default=25)
    parser.add_argument("--filter-groups", action="store_true", help="also run sync with algorithm.filter_groups=true")
    args = parser.parse_args()

    common = [f"trainer.total_steps={args.steps}", f"trainer.val_freq={args.val_freq}", "trainer.save_freq=0"]
    configs = {"sync": [f"engine.cpus_per_worker={args.cores}"]}
    for s in args.staleness:
        configs[f"async s{s}"] = [
            "rollout.mode=async",
            f"rollout.max_staleness={s}",
            f"algorithm.rollout_correction={args.correction}",
            f"engine.cpus_per_worker={args.cores // 2}",
        ]
    if args.filter_groups:
        configs["sync filter"] = [f"engine.cpus_per_worker={args.cores}", "algorithm.filter_groups=true"]
    results: dict[str, list[dict]] = {name: [] for name in configs}
    print(
        f"{'run':>10} {'seed':>4} | {'steps/s':>7} {f'to {args.target:.2f} (s)':>12} {'acc before':>10} "
        f"{'acc after':>9} | {'staleness':>9} {'gen wait s':>10} {'update s':>8} {'weights s':>9} "
        f"{'no-signal rows':>14}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for name, overrides in configs.items():
                r = run(
                    Path(tmp) / f"{name.replace(' ', '_')}_{seed}",
                    [*common, f"trainer.seed={seed}", *overrides],
                    args.target,
                )
                results[name].append(r)
                reached = f"{r['to_target_s']:.1f}" if r["to_target_s"] is not None else "not reached"
                print(
                    f"{name:>10} {seed:>4} | {r['steps_per_s']:>7.2f} {reached:>12} {r['before']:>10.3f} "
                    f"{r['after']:>9.3f} | {r['staleness']:>9.2f} {r['gen_wait_s']:>10.3f} {r['update_s']:>8.3f} "
                    f"{r['weights_s']:>9.3f} {r['zero_adv']:>14.3f}",
                    flush=True,
                )
    print("\nmean over seeds")
    base = statistics.mean(r["steps_per_s"] for r in results["sync"])
    for name, rs in results.items():
        sps = statistics.mean(r["steps_per_s"] for r in rs)
        hit = [r["to_target_s"] for r in rs if r["to_target_s"] is not None]
        to = f"{statistics.mean(hit):.1f} s ({len(hit)}/{len(rs)} reached)" if hit else f"not reached (0/{len(rs)})"
        print(
            f"{name:>10}: {sps:.2f} steps/s ({sps / base:.2f}x sync), to {args.target:.2f}: {to}, final accuracy "
            f"{statistics.mean(r['after'] for r in rs):.3f}, no-signal rows "
            f"{statistics.mean(r['zero_adv'] for r in rs):.3f}"
        )


if __name__ == "__main__":
    main()
