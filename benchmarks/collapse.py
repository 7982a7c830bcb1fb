"""The collapse benchmark: runs that fail naturally, with the guard off and with the default guards, over many seeds.

    python benchmarks/collapse.py --rows clean lr_x10 --seeds 1 2 3     # some rows and seeds; results are saved
    python benchmarks/collapse.py --table                               # the table of every result saved so far
    python benchmarks/collapse.py --cost 3                              # the default guards' step-time cost

Each row is a recipe with one thing changed (below). Every (row, guard, seed) run writes its result to
``benchmarks/results/collapse/<row>/<guard>-s<seed>.json`` (``--results``; in the repository, so the table
outlives the machine that ran it) and is skipped when that file exists (``--again`` reruns it), so the whole
table, hours on a 2-core machine, is filled in any order by several invocations and printed from what is
there. The runs themselves (checkpoints, metrics) go to ``--out``. ``guard off`` is ``guard.enable=false``; ``default`` sets nothing about the guard.

Judged on held-out greedy accuracy after the run: *finite* (the run ended, weights finite) and *within
5 points* of the clean mean of the row's recipe (the clean row's guard-off runs, every seed saved). A seed
*intervened* when any guard acted (any line in ``guard_events.jsonl``).

The last column says which bar a row is held to, and whether the default guards clear it. A *collapse
row* is one where some unguarded seed dies or ends below ``COLLAPSED`` (0.2): the default guards must keep
every seed finite and at least 9 in 10 within 5 points of the clean mean (the verdict also says how many
of the clean recipe's own seeds are: one whose clean seeds spread wider than that cannot show the bar met).
The other rows learn slowly without any instability to catch (flipped rewards, a tiny batch, stale
rollouts): no guard can give them the clean run's signal, so the bar there is *no harm*: every seed finite and at least 9 in 10 ending no
more than 5 points below the lower of the clean mean and the same seed's unguarded run. A clean row's bar
is the issue's: the default mean within 1 point of the unguarded one and at most 1 seed in 10 acted on.
Accuracy does not depend on the machine's load; only ``--cost`` is timed (run it on a quiet machine).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

GUARDS = {"off": ["guard.enable=false"], "default": []}
WITHIN = 0.05  # points of accuracy (as a fraction) below the clean mean still counted as a healthy run
COLLAPSED = 0.2  # an unguarded seed ending below this accuracy (or dead) makes its row a collapse row
SHARE = 0.9  # the share of seeds that must clear a row's bar
RESULTS = Path(__file__).parent / "results" / "collapse"


@dataclass(frozen=True)
class Row:
    """A recipe (None: ``armor run``'s built-in one), what is changed, and the learning-rate multiple."""

    what: str
    overrides: tuple[str, ...] = ()
    recipe: str | None = None
    lr_times: float = 1.0


def _faults(*specs: str) -> str:
    return f"trainer.faults=[{', '.join(specs)}]"


ROWS = {
    "clean": Row("the recipe as shipped"),
    "lr_x3": Row("learning rate 3x from the first step", lr_times=3),
    "lr_x10": Row("learning rate 10x from the first step", lr_times=10),
    "lr_x30": Row("learning rate 30x from the first step", lr_times=30),
    "lr_spike": Row("learning rate 100x for steps 60-62", (_faults("{kind: lr_scale, steps: [60, 61, 62], value: 100}"),)),
    "updates_x8": Row("8 optimizer steps per batch", ("actor.ppo_mini_batch_size=2",)),
    "tiny_batch": Row("2 prompts x 4 samples per step", ("data.train_batch_size=2", "actor.ppo_mini_batch_size=2", "rollout.n=4")),
    "noisy_reward": Row("30% of rewards flipped, every step", (_faults("{kind: flip_reward, steps: {from: 1, to: 100000}, value: 0.3}"),)),
    "temperature": Row("rollout temperature 1.5", ("rollout.temperature=1.5",)),
    "stale": Row("async rollouts, staleness 4", ("rollout.mode=async", "rollout.max_staleness=4")),
    "nan_grad": Row("NaN gradients at steps 40-42 and 100", (_faults("{kind: nan_grad, steps: [40, 41, 42, 100]}"),)),
    "inf_reward": Row("an infinite reward at steps 30 and 90", (_faults("{kind: inf_reward, steps: [30, 90]}"),)),
    "long": Row("1,000 steps at the recipe's learning rate", ("trainer.total_steps=1000",)),
    "cross_domain": Row("recipe:cross_domain as shipped", recipe="recipe:cross_domain"),
    "cross_domain_lr_x10": Row("recipe:cross_domain, learning rate 10x", recipe="recipe:cross_domain", lr_times=10),
    "code": Row("recipe:code as shipped", recipe="recipe:code"),
    "code_lr_x10": Row("recipe:code, learning rate 10x", recipe="recipe:code", lr_times=10),
    "tools": Row("recipe:tools as shipped", recipe="recipe:tools"),
    "tools_lr_x10": Row("recipe:tools, learning rate 10x", recipe="recipe:tools", lr_times=10),
}  # fmt: skip


def clean_row(row: str) -> str:
    """The row whose guard-off mean is this row's reference: the clean run of the same recipe."""
    recipe = ROWS[row].recipe
    return next(name for name, r in ROWS.items() if r.recipe == recipe and not r.overrides and r.lr_times == 1)


def overrides(row: str, guard: str, seed: int) -> list[str]:
    from armor_core.config.schema import load_config

    r = ROWS[row]
    lr = [f"actor.lr={load_config(r.recipe, []).actor.lr * r.lr_times:g}"] if r.lr_times != 1 else []
    return [*r.overrides, *lr, *GUARDS[guard], f"trainer.seed={seed}"]


def run_one(row: str, guard: str, seed: int, run_dir: Path, extra: list[str]) -> dict:
    """One run; what it ended with, whether the guard acted, and its seconds per step."""
    import torch
    from safetensors.torch import load_file

    from armor_core.config.schema import load_config
    from armor_core.loop.trainer import Trainer

    shutil.rmtree(run_dir, ignore_errors=True)
    ovr = [*overrides(row, guard, seed), *extra, f"trainer.run_dir={run_dir}", "trainer.loggers=[jsonl]"]
    cfg = load_config(ROWS[row].recipe, ovr)
    out: dict = {"row": row, "guard": guard, "seed": seed, "overrides": ovr, "acc": None, "finite": False}
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    try:
        summary = trainer.fit()
        out["acc_before"] = summary.get("val_before", {}).get("val/acc_greedy")
        out["acc"] = summary["val_after"]["val/acc_greedy"]
        weights = load_file(str(Path(summary["checkpoint"]) / "model" / "model.safetensors"))
        out["finite"] = all(bool(torch.isfinite(w).all()) for w in weights.values())
    except Exception as e:  # a run that dies is a result here, not a benchmark failure
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[-1][:120] if str(e) else ''}"
    finally:
        trainer.close()
    out["wall_s"] = time.perf_counter() - t0
    events = run_dir / "guard_events.jsonl"
    actions: dict[str, int] = {}
    for line in events.read_text().splitlines() if events.exists() else []:
        e = json.loads(line)
        actions[f"{e['guard']}:{e['action']}"] = actions.get(f"{e['guard']}:{e['action']}", 0) + 1
    out["actions"] = actions
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    times = [r["timing_s/step"] for r in rows if "timing_s/step" in r]
    out["step_s_median"] = statistics.median(times[5:]) if len(times) > 5 else None
    return out


def result_path(results: Path, row: str, guard: str, seed: int) -> Path:
    return results / row / f"{guard}-s{seed}.json"


def load_results(results: Path) -> dict[tuple[str, str], list[dict]]:
    found: dict[tuple[str, str], list[dict]] = {}
    for p in sorted(results.glob("*/*.json")):
        r = json.loads(p.read_text())
        found.setdefault((r["row"], r["guard"]), []).append(r)
    return found


def healthy(r: dict, clean_mean: float | None) -> bool | None:
    if not r["finite"] or r["acc"] is None:
        return False
    return None if clean_mean is None else r["acc"] >= clean_mean - WITHIN


def _acc(r: dict) -> float:
    return r["acc"] if r["finite"] and r["acc"] is not None else 0.0


def verdict(row: str, off: list[dict], on: list[dict], ref: float | None, clean: list[dict] | None = None) -> str:
    """The bar the row is held to (see the module docstring) and whether the default guards' seeds clear it.

    ``clean``: the unguarded runs of the row's clean recipe; a collapse row then also says how many of them end
    within 5 points of their own mean, the share no guard can be expected to beat (a noisy recipe's clean seeds
    miss the bar themselves)."""
    if not on or not off or ref is None:
        return "-"
    if row == clean_row(row):  # the same seeds both ways where there are some: seeds differ by more than a point
        both = {r["seed"] for r in on} & {r["seed"] for r in off}
        paired_on, paired_off = [r for r in on if r["seed"] in both] or on, [r for r in off if r["seed"] in both] or off
        gap = statistics.mean(map(_acc, paired_on)) - statistics.mean(map(_acc, paired_off))
        acted = sum(bool(x["actions"]) for x in on)
        met = abs(gap) <= 0.01 and acted <= max(1, len(on) // 10)
        seeds = f" on the {len(both)} seeds run both ways" if both and len(both) < max(len(on), len(off)) else ""
        return f"clean: {100 * gap:+.1f} pts{seeds}, {acted} acted: {'met' if met else 'NOT met'}"
    finite = all(r["finite"] and r["acc"] is not None for r in on)
    if any(_acc(r) < COLLAPSED for r in off):
        good = sum(healthy(r, ref) is True for r in on)
        kind = "collapse"
        if clean:
            kind += f" (clean seeds: {sum(healthy(r, ref) is True for r in clean)}/{len(clean)})"
    else:
        by_seed = {r["seed"]: _acc(r) for r in off}
        good = sum(_acc(r) >= min(ref, by_seed.get(r["seed"], ref)) - WITHIN for r in on)
        kind = "no harm"
    met = finite and good >= SHARE * len(on)
    return f"{kind}: {good}/{len(on)}: {'met' if met else 'NOT met'}"


def table(results: Path) -> str:
    found = load_results(results)

    def clean_mean(row: str) -> float | None:
        runs = found.get((clean_row(row), "off"), [])
        accs = [r["acc"] for r in runs if r["finite"] and r["acc"] is not None]
        return statistics.mean(accs) if len(accs) == len(runs) and runs else None

    def cell(runs: list[dict], ref: float | None) -> str:
        if not runs:
            return "| - | - | - "
        n = len(runs)
        finite = sum(r["finite"] for r in runs)
        ok = [healthy(r, ref) for r in runs]
        within = "-" if None in ok else f"{sum(ok)}/{n}"
        return f"| {finite}/{n} | {within} | {statistics.mean(map(_acc, runs)):.3f} "

    lines = [
        "| row | what | clean mean | guard off: finite | within 5 pts | mean | default: finite | within 5 pts | mean "
        "| seeds the guard acted on | bar: seeds clearing it |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row, r in ROWS.items():
        off, on = found.get((row, "off"), []), found.get((row, "default"), [])
        if not off and not on:
            continue
        ref = clean_mean(row)
        acted = f"{sum(bool(x['actions']) for x in on)}/{len(on)}" if on else "-"
        ref_s = "-" if ref is None else f"{ref:.3f}"
        bar = verdict(row, off, on, ref, found.get((clean_row(row), "off"), []))
        lines.append(f"| {row} | {r.what} | {ref_s} {cell(off, ref)}{cell(on, ref)}| {acted} | {bar} |")
    seeds = sorted({x["seed"] for runs in found.values() for x in runs})
    lines.append(f"\nseeds saved: {' '.join(map(str, seeds))}; a mean counts a run that died as 0")
    return "\n".join(lines)


def cost(out: Path, repeats: int, steps: int) -> str:
    """Median seconds per step of the clean recipe, guard off and default guards, runs interleaved in one invocation."""
    per: dict[str, list[float]] = {"off": [], "default": []}
    short = [f"trainer.total_steps={steps}", "trainer.val_freq=0", "trainer.val_before_train=false", "data.val_size=16"]
    for i in range(repeats):
        for guard in ("off", "default"):
            r = run_one("clean", guard, 1, out / "cost" / f"{guard}-{i}", short)
            per[guard].append(r["step_s_median"])
            print(f"cost {guard} #{i}: {r['step_s_median']:.4f} s/step", file=sys.stderr, flush=True)
    off, on = statistics.median(per["off"]), statistics.median(per["default"])
    pairs = " ".join(f"{100 * (b - a) / a:+.1f}%" for a, b in zip(per["off"], per["default"]))
    return f"step time, median of {repeats} runs of {steps} steps: off {off:.4f} s, default {on:.4f} s " + (
        f"({100 * (on - off) / off:+.1f}%; pairs {pairs})"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="*", choices=list(ROWS), default=[], help="rows to run (default: none)")
    p.add_argument("--seeds", nargs="*", type=int, default=list(range(1, 11)))
    p.add_argument("--guards", nargs="*", choices=list(GUARDS), default=list(GUARDS))
    p.add_argument("--out", type=Path, default=Path("runs/collapse"), help="where the runs go")
    p.add_argument("--results", type=Path, default=RESULTS, help="where each run's result is saved and read from")
    p.add_argument("--again", action="store_true", help="rerun results already saved")
    p.add_argument("--set", action="append", default=[], help="an extra override for every run (not saved apart!)")
    p.add_argument("--table", action="store_true", help="print the table of the saved results")
    p.add_argument("--cost", type=int, default=0, help="off/default pairs of clean runs for the step-time cost")
    p.add_argument("--cost-steps", type=int, default=60)
    args = p.parse_args()
    if args.rows or args.cost:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    for row in args.rows:
        for seed in args.seeds:
            for guard in args.guards:
                path = result_path(args.results, row, guard, seed)
                if path.exists() and not args.again:
                    continue
                r = run_one(row, guard, seed, args.out / "runs" / row / f"{guard}-s{seed}", args.set)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(r, indent=1))
                print(f"{row} {guard} seed {seed}: acc {r['acc']} finite {r['finite']} {r['actions']}"
                      f"{' ' + r['error'] if 'error' in r else ''} ({r['wall_s']:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    if args.cost:
        print(cost(args.out, args.cost, args.cost_steps))
    if args.table or args.rows:
        print(table(args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
