"""On-policy distillation on the default task: a student from the warm start learns from a stronger teacher.

    python benchmarks/distill.py                         # builds the teacher if missing, then the table
    python benchmarks/distill.py --teacher T --steps 80 --seeds 1 --variants reverse_kl_reward

The teacher is the built-in warm start (``builtin:arithmetic-tiny``, 0.520) trained further with
``armor sft`` (the command is ``TEACHER_COMMAND``; about 100 s on 2 CPU cores). The ``recipe`` variant is
``armor run recipe:distill`` (64 prompts x 2 samples, top-8 forward KL at teacher temperature 0.5, no reward,
lr 5e-4 with a cosine decay); every other variant is the built-in recipe (``armor run``'s defaults: 16
prompts x 8 samples, GRPO advantages, lr 5e-5) with ``algorithm.distill`` set and whatever else it lists.
The student starts from the warm start. Held-out greedy accuracy (the 500 problems of the recipe's
validation) every ``--eval-every`` steps.

Printed per variant and seed: final accuracy, its share of the teacher's held-out accuracy, the first
evaluated step at which accuracy reached ``--target`` (GRPO's final accuracy in the default recipe after
250 steps, the figure in docs/getting-started.md), and ``distill/reverse_kl`` (mean per token) of the first and last steps;
then the mean over seeds. Accuracy does not depend on the machine's load; nothing is timed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TEACHER_COMMAND = [
    "armor", "sft", "--model", "builtin:arithmetic-tiny", "--out", "{out}", "--steps", "1000",
    "--eval-every", "50", "--seed", "1", "--threads", "1",
]  # fmt: skip
GRPO_FINAL = 0.742  # the default recipe's held-out accuracy after 250 steps (docs/getting-started.md)
GRPO_STEPS = 250

RECIPE = "recipe:distill"
VARIANTS = {  # name: overrides; "recipe" runs RECIPE, the others the default recipe
    "recipe": [],
    "reverse_kl_reward": ["algorithm.distill.mode=reverse_kl", "algorithm.distill.via=reward"],
    "reverse_kl_reward_only": [
        "algorithm.distill.mode=reverse_kl",
        "algorithm.distill.via=reward",
        "algorithm.distill.with_rewards=false",
    ],
    "reverse_kl_loss": ["algorithm.distill.mode=reverse_kl", "algorithm.distill.via=loss"],
    "topk_forward_kl": ["algorithm.distill.mode=topk_forward_kl", "algorithm.distill.k=8"],
    "topk_forward_kl_only": [
        "algorithm.distill.mode=topk_forward_kl",
        "algorithm.distill.k=8",
        "algorithm.distill.with_rewards=false",
    ],
}


def build_teacher(out: Path) -> float:
    """The teacher's held-out accuracy (from its ``armor_sft.json``), training it first if ``out`` has none."""
    log = out / "armor_sft.json"
    if not log.exists():
        cmd = [a.replace("{out}", str(out)) for a in TEACHER_COMMAND]
        print("building the teacher:", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    return float(json.loads(log.read_text())["val_accuracy"])


def run_one(run_dir: Path, path: str | None, overrides: list[str]) -> dict:
    from armor_core.config.schema import load_config
    from armor_core.loop.preflight import check_run
    from armor_core.loop.trainer import Trainer

    shutil.rmtree(run_dir, ignore_errors=True)
    cfg = load_config(path, [*overrides, f"trainer.run_dir={run_dir}", "trainer.loggers=[jsonl]"])
    check_run(cfg)  # what armor run checks first: the teacher's tokenizer is the student's
    trainer = Trainer(cfg)
    try:
        summary = trainer.fit()
    finally:
        trainer.close()
    curve, rkl = {}, []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "val/acc_greedy" in row:
            curve[row["step"]] = row["val/acc_greedy"]
        if "distill/reverse_kl" in row:
            rkl.append(row["distill/reverse_kl"])
    return {"acc": summary["val_after"]["val/acc_greedy"], "curve": curve, "rkl": rkl}


def first_step_at(curve: dict, target: float) -> int | None:
    return next((s for s, a in sorted(curve.items()) if a >= target - 1e-9), None)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--teacher", default=None, help="teacher directory (default: built in a temporary directory)")
    p.add_argument("--steps", type=int, default=GRPO_STEPS, help=f"training steps per run (default: {GRPO_STEPS})")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--target", type=float, default=GRPO_FINAL)
    p.add_argument("--variants", default="recipe", help=f"comma-separated, of {', '.join(VARIANTS)} (default: recipe)")
    p.add_argument("--set", action="append", default=[], help="an extra override for every run (repeatable)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="armor_distill_"))
    teacher = Path(args.teacher) if args.teacher else work / "teacher"
    teacher_acc = build_teacher(teacher)
    common = [
        f"algorithm.distill.teacher={teacher}",
        f"trainer.total_steps={args.steps}",
        f"trainer.val_freq={args.eval_every}",
        *args.set,
    ]
    results: dict[str, dict[int, dict]] = {}
    for name in args.variants.split(","):
        path = RECIPE if name == "recipe" else None
        for seed in args.seeds:
            r = run_one(work / f"{name}-s{seed}", path, [*common, *VARIANTS[name], f"trainer.seed={seed}"])
            results.setdefault(name, {})[seed] = r
            print(f"{name} seed {seed}: final {r['acc']:.3f}, curve {r['curve']}", flush=True)
    print(f"\nteacher held-out accuracy {teacher_acc:.3f}; student from the warm start (0.520); target {args.target}")
    print(
        f"| variant | seed | final accuracy ({args.steps} steps) | / teacher | steps to {args.target} | "
        "reverse KL first -> last |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, by_seed in results.items():
        for seed, r in by_seed.items():
            at = first_step_at(r["curve"], args.target)
            kl = f"{r['rkl'][0]:.3f} -> {r['rkl'][-1]:.3f}" if r["rkl"] else "-"
            print(f"| `{name}` | {seed} | {r['acc']:.3f} | {r['acc'] / teacher_acc:.0%} | {at or '-'} | {kl} |")
        if len(by_seed) > 1:
            mean = sum(r["acc"] for r in by_seed.values()) / len(by_seed)
            reached = [first_step_at(r["curve"], args.target) for r in by_seed.values()]
            worst = "-" if None in reached else max(reached)
            print(f"| `{name}` | mean | {mean:.3f} | {mean / teacher_acc:.0%} | {worst} (the slowest seed) | |")
    print(f"| GRPO, the default recipe (README) | 1 | {GRPO_FINAL} ({GRPO_STEPS} steps) | {GRPO_FINAL / teacher_acc:.0%} | "
          f"{GRPO_STEPS} | - |")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"teacher_acc": teacher_acc, "results": results}, indent=1))
    shutil.rmtree(work, ignore_errors=True)  # the runs, and the teacher if built here (--teacher is kept)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
