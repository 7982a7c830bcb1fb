"""The stability benchmark: the built-in recipe under injected faults, guard off and on, same seed.

    python benchmarks/stability.py --steps 150     # every scenario and the guard's cost (about 15 minutes on 2 cores)
    python benchmarks/stability.py --only nan_grad --steps 100

Scenarios (``trainer.faults``, see armor_core/stability/faults.py): NaN gradients at a few steps; the learning
rate x100 for three steps; a poisoned batch (rewards flipped) for ten steps; rollouts from weights
four steps old for ten steps; Inf in a reward; and a learning rate ten times the default for the
whole run. Each runs with ``guard.enable=false`` and with the default guard stack (nothing about the
guard set), and is compared with the clean run. A run that dies (a NaN reaching the sampler) counts as non-finite weights.

Prints: scenario, guard off (held-out greedy accuracy, weights finite), guard on (accuracy, weights
finite, actions taken), the clean accuracy, and the guard's cost on the clean run's step time
(interleaved off/on pairs, see ``guard_cost``). Writes ``armor report``'s overlay of each scenario's
guard-off and guard-on runs to ``<out>/report/<scenario>/index.html``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

DEFAULT_LR = 5e-5  # the built-in recipe's actor.lr (main() checks it)

SCENARIOS = {
    "nan_grad": ["trainer.faults=[{kind: nan_grad, steps: [40, 41, 42, 100]}]"],
    "lr_x100": ["trainer.faults=[{kind: lr_scale, steps: [60, 61, 62], value: 100}]"],
    "poisoned_batch": ["trainer.faults=[{kind: flip_reward, steps: {from: 80, to: 89}}]"],
    "stale_rollout": ["trainer.faults=[{kind: stale_rollout, steps: {from: 70, to: 79}, value: 4}]"],
    "inf_reward": ["trainer.faults=[{kind: inf_reward, steps: [30, 90]}]"],
    "lr_x10_run": [f"actor.lr={10 * DEFAULT_LR}"],
}


#: "guard on" is the default guard stack, nothing set by hand: a threshold read off the run being judged would prove
#: nothing about a user's run
GUARD_ON: list[str] = []


def run_one(run_dir: Path, overrides: list[str]) -> dict:
    from safetensors.torch import load_file

    from armor_core.config.schema import load_config
    from armor_core.loop.trainer import Trainer

    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = load_config(
        None,
        [
            *overrides,
            f"trainer.run_dir={run_dir}",
            "trainer.loggers=[jsonl]",
            "trainer.save_freq=10",
            "trainer.keep_checkpoints=3",
        ],
    )
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    out = {"acc": None, "finite": False, "actions": {}, "error": None}
    try:
        summary = trainer.fit()
        out["acc"] = summary["val_after"]["val/acc_greedy"]
        weights = load_file(str(Path(summary["checkpoint"]) / "model" / "model.safetensors"))
        import torch

        out["finite"] = all(bool(torch.isfinite(w).all()) for w in weights.values())
    except Exception as e:  # a run that dies is a result here, not a benchmark failure
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[-1][:80]}"
    finally:
        trainer.close()
    events = run_dir / "guard_events.jsonl"
    if events.exists():
        for line in events.read_text().splitlines():
            e = json.loads(line)
            key = f"{e['guard']}:{e['action']}"
            out["actions"][key] = out["actions"].get(key, 0) + 1
    out["wall_s"] = time.perf_counter() - t0
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        steps = [json.loads(line) for line in metrics.read_text().splitlines()]
        out["step_times"] = [r["timing_s/step"] for r in steps if "timing_s/step" in r]
    return out


def guard_cost(root: Path, repeats: int, steps: int) -> tuple[float, float, list[float]]:
    """Median seconds per step of the clean recipe with the guard off and on, runs interleaved.

    One pair of runs differs by a few percent from noise alone on this machine, so the pairs are
    repeated off/on/off/on... and each run contributes the median of its steps after a warm-up.
    """
    import statistics

    per = {"off": [], "on": []}
    for i in range(repeats):
        for guard in ("off", "on"):
            ovr = [
                f"trainer.total_steps={steps}",
                "trainer.val_freq=0",
                "trainer.val_before_train=false",
                "data.val_size=16",
                *(["guard.enable=false"] if guard == "off" else GUARD_ON),
            ]
            r = run_one(root / f"cost-{guard}-{i}", ovr)
            per[guard].append(statistics.median(r["step_times"][5:]))
    off, on = statistics.median(per["off"]), statistics.median(per["on"])
    return off, on, [100 * (b - a) / a for a, b in zip(per["off"], per["on"])]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="*", choices=list(SCENARIOS), help="run only these scenarios")
    p.add_argument("--steps", type=int, default=250, help="training steps per run (default: the built-in recipe's 250)")
    p.add_argument("--out", default="runs/stability", help="where the runs go")
    p.add_argument("--json", help="also write the results here")
    p.add_argument(
        "--cost-repeats", type=int, default=3, help="off/on pairs of clean runs for the guard's cost (0 skips it)"
    )
    p.add_argument("--cost-steps", type=int, default=60, help="steps per cost run")
    args = p.parse_args()

    import ray

    from armor_core.config.schema import load_config

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    assert load_config(None, []).actor.lr == DEFAULT_LR, (
        "the built-in recipe's learning rate changed; update DEFAULT_LR"
    )
    base = [f"trainer.total_steps={args.steps}", "trainer.val_freq=50"]
    root = Path(args.out)
    results = {}
    for guard in ("off", "on"):
        results[("clean", guard)] = run_one(
            root / f"clean-{guard}", [*base, *(["guard.enable=false"] if guard == "off" else GUARD_ON)]
        )
        print(f"clean guard {guard}: {results[('clean', guard)]}", file=sys.stderr)
    for name in args.only or list(SCENARIOS):
        for guard in ("off", "on"):
            ovr = [*base, *SCENARIOS[name], *(["guard.enable=false"] if guard == "off" else GUARD_ON)]
            results[(name, guard)] = run_one(root / f"{name}-{guard}", ovr)
            print(f"{name} guard {guard}: {results[(name, guard)]}", file=sys.stderr)
    cost = guard_cost(root, args.cost_repeats, args.cost_steps) if args.cost_repeats else None
    ray.shutdown()

    clean = results[("clean", "on")]["acc"]
    fmt = lambda r: "died" if r["error"] else f"{r['acc']:.3f}"  # noqa: E731
    print(
        f"\nstability benchmark: built-in recipe, {args.steps} steps, seed 1; clean run accuracy "
        f"{results[('clean', 'off')]['acc']:.3f} (guard off), {clean:.3f} (guard on)"
    )
    print(
        f"{'scenario':16s} {'off: acc':>9s} {'finite':>7s} {'on: acc':>9s} {'finite':>7s} {'within 5 pts':>12s}  "
        "actions"
    )
    for name in args.only or list(SCENARIOS):
        off, on = results[(name, "off")], results[(name, "on")]
        ok = on["acc"] is not None and abs(on["acc"] - clean) <= 0.05 and on["finite"]
        actions = ", ".join(f"{k} x{v}" for k, v in sorted(on["actions"].items())) or "-"
        print(
            f"{name:16s} {fmt(off):>9s} {str(off['finite']):>7s} {fmt(on):>9s} {str(on['finite']):>7s} "
            f"{str(ok):>12s}  {actions}"
        )
    if cost:
        off_s, on_s, pairs = cost
        print(
            f"guard cost on the clean recipe ({args.cost_repeats} interleaved off/on pairs of {args.cost_steps} "
            f"steps, median step time): {off_s:.4f} s/step off, {on_s:.4f} s/step on "
            f"({100 * (on_s - off_s) / off_s:+.1f}%; pairs {', '.join(f'{x:+.1f}%' for x in pairs)})"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({f"{k[0]}/{k[1]}": v for k, v in results.items()}, indent=1))
    for page in write_overlays(root, ["clean", *(args.only or SCENARIOS)]):
        print(f"guard off/on overlay: {page}")
    return 0


def write_overlays(root: Path, names: list[str]) -> list[Path]:
    """``armor report`` of each scenario's guard-off and guard-on runs on the same axes, in
    ``root/report/<scenario>/``."""
    from armor_core.report import PAGE, write_report

    pages = []
    for name in names:
        out = root / "report" / name
        write_report([root / f"{name}-off", root / f"{name}-on"], out, labels=["guard off", "guard on"])
        pages.append(out / PAGE)
    return pages


if __name__ == "__main__":
    sys.exit(main())
