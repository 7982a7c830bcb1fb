"""``armor rm train``: the command's arguments; the training is ``armor_core.train.reward_model``.

    armor rm train --pairs prefs.jsonl --model builtin:arithmetic-tiny --out runs/rm

Fits a classifier reward model on JSONL preference pairs ``{"prompt", "chosen", "rejected"}`` with the
Bradley-Terry loss, optionally with LoRA (``--lora-rank``) and in ``--nproc`` data-parallel processes, and writes
the directory ``reward.model.path`` loads.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from armor_core.train.reward_model import load_preferences, train_rank

__all__ = ["add_parser", "main"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "rm",
        help="reward models: `armor rm train` fits one on preference pairs",
        description="Reward models for reward.model. `armor rm train` trains a sequence-classification model with "
        "the Bradley-Terry loss on JSONL preference pairs {prompt, chosen, rejected} and reports held-out ranking "
        "accuracy.",
    )
    sub = p.add_subparsers(dest="rm_command", metavar="<rm command>", required=True)
    t = sub.add_parser("train", help="train a reward model on preference pairs")
    t.add_argument("--pairs", required=True, help="JSONL of {prompt, chosen, rejected}")
    t.add_argument("--model", required=True, help="local causal-LM directory (or builtin:NAME) to start from")
    t.add_argument("--out", required=True, help="directory to write the reward model to")
    t.add_argument("--val-pairs", help="held-out pairs (default: the last --val-fraction of --pairs, shuffled)")
    t.add_argument("--val-fraction", type=float, default=0.1, help="held-out share of --pairs (default 0.1)")
    t.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    t.add_argument("--batch-size", type=int, default=32, help="pairs per step (default 32)")
    t.add_argument("--lr", type=float, default=1e-4, help="AdamW learning rate (default 1e-4)")
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--eval-every", type=int, default=50, help="steps between held-out evaluations (default 50)")
    t.add_argument("--max-length", type=int, default=512, help="tokens per side, the end kept (default 512)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=0, help="torch threads per process (default: cores / --nproc)")
    t.add_argument("--lora-rank", type=int, default=0, help="LoRA adapters of this rank (default 0: train all)")
    t.add_argument("--lora-alpha", type=float, default=16.0, help="LoRA scaling numerator (default 16)")
    t.add_argument(
        "--lora-targets",
        default="all-linear",
        help="comma-separated linear layer names to adapt (default all-linear: every one but the score head)",
    )
    t.add_argument("--nproc", type=int, default=1, help="data-parallel processes (gloo, DDP; default 1)")
    t.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from armor_core.errors import UserFacingError

    try:
        return _main(args)
    except ValueError as e:
        raise UserFacingError(f"armor rm train: {e}") from e


def _check_args(args: argparse.Namespace) -> None:
    for name in ("steps", "batch_size", "eval_every", "max_length", "nproc"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if not 0 < args.val_fraction < 1 and not args.val_pairs:
        raise ValueError(f"--val-fraction={args.val_fraction} must lie between 0 and 1")
    if args.batch_size % args.nproc:
        raise ValueError(f"--batch-size={args.batch_size} must be a multiple of --nproc={args.nproc}: each rank "
                         "takes an equal share of every batch")  # fmt: skip
    if args.lora_rank < 0 or args.lora_alpha <= 0:
        raise ValueError(f"--lora-rank={args.lora_rank} must be >= 0 and --lora-alpha={args.lora_alpha} positive")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out} is a file; give a directory to write the reward model to")


def _main(args: argparse.Namespace) -> int:
    _check_args(args)
    load_preferences(args.pairs)  # a bad file is one error here, not one per rank
    if args.val_pairs:
        load_preferences(args.val_pairs)
    if args.nproc == 1:
        train_rank(0, args)
        return 0
    import os

    import torch.multiprocessing as mp

    from armor_core.engine import free_port

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    try:
        mp.spawn(train_rank, args=(args,), nprocs=args.nproc, join=True)
    except mp.ProcessRaisedException as e:
        last = [line for line in str(e).splitlines() if line.strip()][-1].strip()
        raise ValueError(f"rank {e.error_index} of --nproc={args.nproc} failed: {last}") from None
    except mp.ProcessExitedException as e:
        raise ValueError(f"rank {e.error_index} of --nproc={args.nproc} died (exit code {e.exit_code})") from None
    return 0
