"""Every advantage estimator and policy loss on the default task, so users can choose from a table.

    python benchmarks/algorithms.py                          # 3 seeds x 250 steps each, and the high-lr runs
    python benchmarks/algorithms.py --seeds 1 --only losses  # the policy losses, one seed
    python benchmarks/algorithms.py --only sapo,gpg --steps 100
    python benchmarks/algorithms.py --only-high-lr            # the collapse counts alone
    python benchmarks/algorithms.py --only losses --set actor.ppo_mini_batch_size=4   # 4 updates per batch

Each variant is the built-in recipe (``armor run``'s defaults: the tiny model, the arithmetic task,
GRPO advantages, ``ppo_clip``) with one thing changed: ``algorithm.adv_estimator`` for an estimator,
``actor.policy_loss`` for a loss. Held-out greedy accuracy is measured every ``--eval-every`` steps.

Printed per variant: final held-out accuracy (mean over seeds, and the spread), the first evaluated
step at which accuracy reached ``--target`` (median over seeds; "-" if a seed never did), and how many
of the seeds collapse at ten times the default learning rate (``actor.lr=5e-4``, the stability
benchmark's ``lr_x10_run``): final accuracy below ``--collapse-below`` or non-finite weights (those
runs validate only before and after training; ``--only-high-lr`` runs them alone).
Accuracy does not depend on the machine's load; nothing here is timed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

ESTIMATORS = ["grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo", "pass_at_k",
              "grpo_passk", "remax"]  # fmt: skip
LOSSES = ["ppo_clip", "gspo", "cispo", "sapo", "geo_mean", "gpg", "dppo_tv", "dppo_kl", "dro"]
HIGH_LR = 5e-4  # ten times the recipe's actor.lr


def variants(only: str | None) -> list[tuple[str, str, list[str]]]:
    """``(kind, name, overrides)`` for the selected variants (``--only``: estimators, losses, or names)."""
    from armor_core.plugins import get_plugin_manager

    pm = get_plugin_manager()
    needs = {"pass_at_k": ["algorithm.adv_kwargs={k: 4}"]}  # its k: pass@4 of each group's samples
    out = [
        ("estimator", n, [f"algorithm.adv_estimator={n}", *needs.get(n, [])])
        for n in ESTIMATORS
        if n in pm.names("advantage_estimator")
    ]
    out += [("loss", n, [f"actor.policy_loss={n}"]) for n in LOSSES if n in pm.names("policy_loss")]
    kinds = {"estimators": "estimator", "losses": "loss"}
    if only in kinds:
        return [v for v in out if v[0] == kinds[only]]
    if only:
        wanted = set(only.split(","))
        return [v for v in out if v[1] in wanted]
    return out


def run_one(run_dir: Path, overrides: list[str]) -> dict:
    from safetensors.torch import load_file

    from armor_core.config.schema import load_config
    from armor_core.loop.trainer import Trainer

    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = load_config(None, [*overrides, f"trainer.run_dir={run_dir}", "trainer.loggers=[jsonl]"])
    trainer = Trainer(cfg)
    out: dict = {"acc": float("nan"), "finite": False, "curve": {}}
    try:
        summary = trainer.fit()
        out["acc"] = summary["val_after"]["val/acc_greedy"]
        import torch

        weights = load_file(str(Path(summary["checkpoint"]) / "model" / "model.safetensors"))
        out["finite"] = all(bool(torch.isfinite(w).all()) for w in weights.values())
    except Exception as e:  # a run that dies is a result here (a collapse), not a benchmark failure
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[-1][:80]}"
    finally:
        trainer.close()
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        for line in metrics.read_text().splitlines():
            row = json.loads(line)
            if "val/acc_greedy" in row:
                out["curve"][row["step"]] = row["val/acc_greedy"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--target", type=float, default=0.65)
    ap.add_argument("--collapse-below", type=float, default=0.2)
    ap.add_argument("--only", help="estimators, losses, or comma-separated names")
    ap.add_argument("--no-high-lr", action="store_true", help="skip the collapse runs at 10x the learning rate")
    ap.add_argument("--only-high-lr", action="store_true", help="only the collapse runs (the table's last column)")
    ap.add_argument("--out", type=Path, default=None, help="run directories here (default: a temporary one)")
    ap.add_argument("--set", action="append", default=[], help="an extra override for every run (repeatable)")
    args = ap.parse_args()
    root = args.out or Path(tempfile.mkdtemp(prefix="armor-algorithms-"))
    base = [f"trainer.total_steps={args.steps}", f"trainer.val_freq={args.eval_every}", *args.set]
    rows = []
    for kind, name, overrides in variants(args.only):
        runs = (
            []
            if args.only_high_lr
            else [run_one(root / f"{name}-s{s}", [*base, *overrides, f"trainer.seed={s}"]) for s in args.seeds]
        )
        collapsed = None
        if not args.no_high_lr:  # judged on the final accuracy alone: validated only before and after training
            high_base = [*base, "trainer.val_freq=0", f"actor.lr={HIGH_LR}"]  # a later override wins
            high = [
                run_one(root / f"{name}-lr-s{s}", [*high_base, *overrides, f"trainer.seed={s}"]) for s in args.seeds
            ]
            collapsed = sum(not r["finite"] or not r["acc"] >= args.collapse_below for r in high)
        accs = [r["acc"] for r in runs]
        reached = [min((s for s, a in r["curve"].items() if a >= args.target), default=None) for r in runs]
        steps_to = statistics.median(reached) if runs and None not in reached else None
        acc = (statistics.mean(accs), (max(accs) - min(accs)) / 2) if runs else None
        rows.append((kind, name, acc, steps_to, collapsed))
        errors = [r["error"] for r in runs if "error" in r]  # a run that died: its last line
        summary = {"variant": name, "acc": accs, "reached": reached, "collapsed_at_high_lr": collapsed}
        if not args.no_high_lr:
            summary["high_lr_acc"] = [r["acc"] for r in high]
        print(json.dumps({**summary, "errors": errors}), flush=True)
    n = len(args.seeds)
    print(f"\n{args.steps} steps, seeds {' '.join(map(str, args.seeds))}, held-out greedy accuracy every "
          f"{args.eval_every} steps; collapse: final accuracy < {args.collapse_below} or non-finite weights after "
          f"{args.steps} steps at actor.lr={HIGH_LR}\n")  # fmt: skip
    print(f"| kind | name | final accuracy (mean +- half range) | steps to {args.target} (median) | "
          f"collapsed at 10x lr (of {n}) |\n|---|---|---:|---:|---:|")  # fmt: skip
    for kind, name, acc, steps_to, collapsed in rows:
        reach = "-" if steps_to is None else f"{steps_to:g}"
        final = "-" if acc is None else f"{acc[0]:.3f} +- {acc[1]:.3f}"
        print(f"| {kind} | `{name}` | {final} | {reach} | {'-' if collapsed is None else collapsed} |")


if __name__ == "__main__":
    main()
