"""Full fine-tuning against LoRA on the same model and task: memory, optimizer state, checkpoint
size, speed and accuracy.

    python benchmarks/lora.py                                  # the default job, 250 steps each
    python benchmarks/lora.py --steps 100 --lora-rank 16 --lora-lr 2e-3 --kl
    python benchmarks/lora.py --memory                         # one worker's memory on a 190M-parameter model

Both runs are the built-in recipe (``armor run``: the shipped tiny Qwen2, two-number addition,
GRPO, 16 prompts x 8 samples) through the whole trainer, with the same seed; they differ in
``model.lora_rank`` and the learning rate (``--full-lr``, ``--lora-lr``: LoRA's adapters need a
larger one). With ``--kl`` both use a KL loss, so the full run builds a reference copy and the LoRA
run does not (it switches its adapters off instead).

Printed per run: the actor worker's peak RSS (``perf/max_rss_gb``: model, optimizer, activations,
and the reference copy where there is one), the optimizer state's bytes (from the checkpoint),
the checkpoint's size on disk, seconds per step (median) and held-out greedy accuracy before and
after.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path


def tensor_bytes(x) -> int:
    import torch

    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, dict):
        return sum(tensor_bytes(v) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(tensor_bytes(v) for v in x)
    return 0


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run(run_dir: Path, overrides: list[str]) -> dict:
    from armor_core.config.schema import load_config
    from armor_core.loop.trainer import Trainer
    from armor_core.storage.state_io import load_checkpoint_state

    trainer = Trainer(load_config(None, [*overrides, f"trainer.run_dir={run_dir}"]))
    try:
        summary = trainer.fit()
    finally:
        trainer.close()
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "timing_s/step" in r]
    ckpt = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    optim = load_checkpoint_state(ckpt / "actor_state")["optimizer"]
    return {
        "peak_rss_gb": max(r.get("perf/max_rss_gb", float("nan")) for r in steps),
        "optimizer_mb": tensor_bytes(optim) / 1e6,
        "checkpoint_mb": dir_bytes(ckpt) / 1e6,
        "s_per_step": statistics.median(r["timing_s/step"] for r in steps),
        "acc_before": summary["val_before"]["val/acc_greedy"],
        "acc_after": summary["val_after"]["val/acc_greedy"],
    }


def memory_case(lora_rank: int, hidden: int, layers: int) -> dict:
    """One actor worker (in this process, no Ray) on a random Qwen2 with vocabulary 151,936 and a KL
    loss: peak RSS after building it and after one update, the optimizer state, the reference copy."""
    import resource

    import torch

    from armor_core.config.schema import load_config, to_dict
    from armor_core.dataproto.protocol import DataProto
    from armor_core.models.loading import build_tiny_model, load_tokenizer, resolve_model_path
    from armor_core.workers.actor.worker import ActorWorker

    tmp = Path(tempfile.mkdtemp(prefix="armor-lora-mem-"))
    try:
        tok = load_tokenizer(resolve_model_path("builtin:arithmetic-tiny"))
        build_tiny_model(
            "qwen2",
            151_936,
            hidden_size=hidden,
            num_layers=layers,
            num_heads=hidden // 64,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            bos_token_id=tok.bos_token_id,
        ).save_pretrained(tmp / "model")
        tok.save_pretrained(tmp / "model")
        rows, p_len, r_len = 8, 32, 64
        cfg = load_config(
            None,
            [
                f"model.path={tmp / 'model'}",
                f"model.lora_rank={lora_rank}",
                "actor.use_kl_loss=true",
                f"trainer.run_dir={tmp / 'run'}",
                f"data.train_batch_size={rows}",
                f"actor.ppo_mini_batch_size={rows}",
                "rollout.n=1",
                f"rollout.max_new_tokens={r_len}",
                "data.train_size=64",
                "data.val_size=8",
            ],
        )
        w = ActorWorker(to_dict(cfg))
        built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(4, 18, (rows, p_len + r_len), generator=g)
        data = DataProto.from_dict(
            tensors={
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "position_ids": torch.arange(p_len + r_len).expand(rows, -1).contiguous(),
                "responses": ids[:, p_len:],
                "response_mask": torch.ones(rows, r_len, dtype=torch.long),
                "advantages": torch.randn(rows, r_len, generator=g),
            }
        )
        data["ref_log_prob"] = w.compute_ref_log_prob(data)["ref_log_prob"]
        w.update_actor(data, step=1)
        return {
            "params": sum(p.numel() for p in w.model.parameters()),
            "built_gb": built,
            "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9,
            "optimizer_mb": tensor_bytes(w.optimizer.state_dict()["state"]) / 1e6,
            "reference_copy_mb": sum(p.numel() * p.element_size() for p in w.ref_model.parameters()) / 1e6
            if w.ref_model is not None
            else 0.0,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def memory_table(args: argparse.Namespace) -> None:
    """Each case in its own process (a process's peak RSS only grows)."""
    import subprocess

    print(
        f"one actor worker, random Qwen2 (vocabulary 151,936, hidden {args.memory_hidden}, {args.memory_layers} "
        "layers), KL loss, 8 rows x (32 + 64) tokens, one update"
    )
    print(
        "| run | parameters | RSS after building (GB) | peak after one update (GB) | optimizer state (MB) | "
        "reference copy (MB) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, rank in (("full", 0), (f"LoRA r={args.lora_rank}", args.lora_rank)):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--memory-case",
                str(rank),
                "--memory-hidden",
                str(args.memory_hidden),
                "--memory-layers",
                str(args.memory_layers),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"| {name} | {r['params'] / 1e6:.0f}M | {r['built_gb']:.2f} | {r['peak_gb']:.2f} | "
            f"{r['optimizer_mb']:.1f} | {r['reference_copy_mb']:.0f} |"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=250)
    p.add_argument("--full-lr", type=float, default=5e-5)
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lora-alpha", type=float, default=32.0)
    p.add_argument("--lora-lr", type=float, default=5e-4)
    p.add_argument("--kl", action="store_true", help="add a KL loss (a reference policy) to both runs")
    p.add_argument("--keep", metavar="DIR", help="keep the runs under DIR")
    p.add_argument("overrides", nargs="*", help="further config overrides for both runs")
    p.add_argument(
        "--memory",
        action="store_true",
        help="instead of the runs: one worker's memory with and without LoRA on a larger random model",
    )
    p.add_argument("--memory-hidden", type=int, default=512)
    p.add_argument("--memory-layers", type=int, default=8)
    p.add_argument("--memory-case", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_case is not None:
        print(json.dumps(memory_case(args.memory_case, args.memory_hidden, args.memory_layers)))
        return 0
    if args.memory:
        memory_table(args)
        return 0
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="armor-lora-bench-"))
    common = [
        f"trainer.total_steps={args.steps}",
        "trainer.val_freq=0",
        "trainer.loggers=[jsonl]",
        *(["actor.use_kl_loss=true"] if args.kl else []),
        *args.overrides,
    ]
    runs = {
        "full": [*common, f"actor.lr={args.full_lr}"],
        f"lora r={args.lora_rank}": [
            *common,
            f"actor.lr={args.lora_lr}",
            f"model.lora_rank={args.lora_rank}",
            f"model.lora_alpha={args.lora_alpha}",
        ],
    }
    try:
        results = {
            name: run(root / name.replace(" ", "_").replace("=", ""), overrides) for name, overrides in runs.items()
        }
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"{args.steps} steps each{', KL loss' if args.kl else ''}; full lr {args.full_lr:g}, LoRA lr "
        f"{args.lora_lr:g} (alpha {args.lora_alpha:g})"
    )
    print(
        "| run | worker peak RSS (GB) | optimizer state (MB) | checkpoint (MB) | s/step | held-out acc before -> "
        "after |"
    )
    print("|---|---:|---:|---:|---:|---|")
    for name, r in results.items():
        print(
            f"| {name} | {r['peak_rss_gb']:.2f} | {r['optimizer_mb']:.2f} | {r['checkpoint_mb']:.2f} | "
            f"{r['s_per_step']:.3f} | {r['acc_before']:.3f} -> {r['acc_after']:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
