"""Data-parallel scaling: step time and tokens/s for 1 and 2 actor workers at the same global batch.

    python benchmarks/scaling.py                       # 1 worker, 2 workers DDP, 2 workers FSDP2 (about 2 minutes on 2
    cores)
    python benchmarks/scaling.py --steps 8 --warmup 2 --batch 16 --n 8 --max-new-tokens 16

Each configuration runs the built-in recipe (tiny Qwen2, GRPO) through the whole trainer on a
local Ray cluster, with the same seed and the same global batch, for ``warmup + steps`` steps;
the table shows medians over the measured steps: the whole step, its update part (the actor's
forward/backward/optimizer step, where data parallelism acts), the weight sync to the rollout
engine (free when colocated, and under FSDP2 from the shards; with a copy a gather of the full weights into it),
generation, and tokens (prompt + response) per second of step time. FSDP2 runs twice: generating from the
shards (the default: every decoding step gathers the layers) and from a full
copy per rank (``actor.fsdp_generation=copy``: the sync gathers the weights once per update).

The machine's cores are split among the workers: on a 2-core machine, 1 worker x 2 cores against
2 workers x 1 core each. That is the honest comparison for a fixed machine; on a cluster each
worker would bring its own cores or GPU, and the ideal would be about half the update time.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path


def run_one(run_dir: Path, overrides: list[str]) -> list[dict]:
    from armor_core.config.schema import load_config
    from armor_core.loop.trainer import Trainer

    cfg = load_config(None, [*overrides, f"trainer.run_dir={run_dir}"])
    trainer = Trainer(cfg)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if "timing_s/step" in line
    ]


def main() -> None:
    import os

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=6, help="measured steps")
    p.add_argument("--warmup", type=int, default=2, help="steps run first and not measured")
    p.add_argument("--batch", type=int, default=16, help="prompts per step (data.train_batch_size)")
    p.add_argument("--n", type=int, default=8, help="samples per prompt (rollout.n)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    args = p.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    common = [
        f"data.train_batch_size={args.batch}",
        f"actor.ppo_mini_batch_size={args.batch}",
        f"rollout.n={args.n}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        f"trainer.total_steps={args.warmup + args.steps}",
        "trainer.val_before_train=false",
        "data.val_size=2",
        "trainer.loggers=[jsonl]",
        "trainer.val_freq=0",
        f"data.train_size={args.batch * (args.warmup + args.steps)}",
    ]
    configs = [
        ("1 worker", 1, "ddp", []),
        ("2 workers, DDP", 2, "ddp", []),
        ("2 workers, FSDP2", 2, "fsdp2", []),  # generating from the shards (actor.fsdp_generation=shards)
        ("FSDP2, full copy", 2, "fsdp2", ["actor.fsdp_generation=copy"]),
    ]
    root = Path(tempfile.mkdtemp(prefix="armor_scaling_"))
    rows = []
    try:
        for i, (label, n, strategy, extra) in enumerate(configs):
            cpus = max(1, cores // n)
            steps = run_one(
                root / f"{i}_{n}_{strategy}",
                [
                    *common,
                    f"actor.num_workers={n}",
                    f"actor.strategy={strategy}",
                    f"engine.cpus_per_worker={cpus}",
                    *extra,
                ],
            )
            measured = steps[args.warmup :]
            med = lambda key: statistics.median(m[key] for m in measured)  # noqa: E731
            tokens = statistics.median(m["perf/total_num_tokens"] for m in measured)
            rows.append(
                (
                    label,
                    f"{n} x {cpus}",
                    med("timing_s/step"),
                    med("timing_s/update_actor"),
                    med("timing_s/update_weights"),
                    med("timing_s/gen"),
                    tokens / med("timing_s/step"),
                )
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"settings: builtin:arithmetic-tiny, GRPO, {args.batch} prompts x {args.n} samples = {args.batch * args.n} "
        f"rows per step, max_new_tokens={args.max_new_tokens}, {args.warmup} warm-up + {args.steps} measured steps "
        f"(medians), {cores} cores"
    )
    print(
        f"{'config':<18} {'workers x cores':>15} {'step s':>8} {'update s':>9} {'sync s':>7} {'gen s':>7} "
        f"{'tokens/s':>9}"
    )
    for label, wc, step, upd, sync, gen, tps in rows:
        print(f"{label:<18} {wc:>15} {step:>8.3f} {upd:>9.3f} {sync:>7.3f} {gen:>7.3f} {tps:>9.0f}")


if __name__ == "__main__":
    main()
