"""``armor sft``: the command's arguments; the training is ``armor_core.train.sft``.

RL on a verifiable reward needs a policy that already succeeds sometimes: ``armor sft`` fine-tunes a causal LM
on (prompt, response) pairs or multi-turn traces, with held-out greedy accuracy as it goes, and writes a Hugging
Face directory that ``armor run model.path=DIR`` and vLLM load as is. ``--stop-at-accuracy`` is how
``builtin:arithmetic-tiny`` was deliberately made *half* trained; the exact command is in that model's README.md.

Long function: ``add_parser``, the command's options declared one after another, which is how argparse reads.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from armor_core.train.sft import TINY_ARCHS, fresh_char_model, load_pairs, run_sft, task_pairs
from armor_core.train.sft_reward import parse_kwargs, reward_passed
from armor_core.train.sft_traces import is_trace_file, load_traces
from armor_core.train.steps import command_args, save_trained

__all__ = ["add_parser", "main"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sft",
        help="supervised fine-tuning on (prompt, response) pairs; makes warm starts for RL",
        description="Supervised fine-tuning with the loss on response tokens only. Trains a local model directory "
        "or a fresh char-level tiny model (--init tiny-qwen2, or tiny-deepseek-v3 for a mixture of experts) on a "
        "built-in task's train split or a "
        "JSONL of {prompt, response} (or {prompt, ground_truth}), reports held-out greedy exact-match "
        "accuracy, and saves a Hugging Face directory.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="local model directory (or builtin:NAME) to fine-tune")
    src.add_argument(
        "--init",
        choices=sorted(TINY_ARCHS),
        help="start from a fresh char-level model, random init: tiny-qwen2 (~1M parameters) or tiny-deepseek-v3 "
        "(DeepSeek-V3's architecture: 4 routed experts, top-2, a shared expert, latent attention)",
    )
    p.add_argument("--out", required=True, help="directory to write the fine-tuned model and tokenizer to")
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow running Python code from the --model directory (its config.json auto_map)",
    )
    p.add_argument(
        "--task",
        default="arithmetic",
        help="built-in task (a registered `task` plugin) used when --data is not given (default: arithmetic)",
    )
    p.add_argument(
        "--task-kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="task parameter, e.g. digits=3 (repeatable; values are parsed as JSON when they can be)",
    )
    p.add_argument(
        "--data",
        help="JSONL of {prompt, response} or {prompt, ground_truth} rows, or of multi-turn traces {messages, tools} "
        "(loss on the assistant turns only; see armor_core.train.sft_traces), instead of --task",
    )
    p.add_argument(
        "--val-data", help="held-out JSONL (default: the task's test split, or the last rows of a shuffled --data)"
    )
    p.add_argument("--train-size", type=int, default=4096, help="train rows generated from the task (default: 4096)")
    p.add_argument("--val-size", type=int, default=500, help="held-out rows for accuracy (default: 500)")
    p.add_argument("--steps", type=int, default=2000, help="maximum optimizer steps (default: 2000)")
    p.add_argument("--batch-size", type=int, default=64, help="rows per step (default: 64)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak AdamW learning rate (default: 1e-3)")
    p.add_argument("--warmup-steps", type=int, default=20, help="linear warm-up steps (default: 20)")
    p.add_argument(
        "--lr-schedule",
        choices=["constant", "cosine", "linear"],
        default="constant",
        help="after warm-up: constant, or decay to 0 at --steps (default: constant)",
    )
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (default: 0)")
    p.add_argument(
        "--eval-every", type=int, default=50, help="evaluate held-out greedy accuracy every N steps (default: 50)"
    )
    p.add_argument(
        "--stop-at-accuracy",
        type=float,
        default=None,
        help="stop at the first evaluation with held-out accuracy >= this (e.g. 0.5)",
    )
    p.add_argument(
        "--val-reward",
        metavar="DOMAIN",
        help="held-out accuracy is the share of greedy responses this reward domain scores 1 (code: the pass rate), "
        "instead of exact match with the ground truth",
    )
    p.add_argument(
        "--val-reward-kwarg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a parameter of --val-reward's domain, e.g. whole_response=true (repeatable; values parsed as JSON)",
    )
    p.add_argument("--max-new-tokens", type=int, default=8, help="generation length for evaluation (default: 8)")
    p.add_argument("--seed", type=int, default=1, help="seed for initialisation, data and order (default: 1)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.set_defaults(func=main)


# -- the command ----------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> int:
    from armor_core.errors import UserFacingError
    from armor_core.plugins import PluginError

    try:
        return _main(args)
    except (ValueError, PluginError) as e:  # bad paths, data or arguments: one clear line, no traceback
        raise UserFacingError(f"armor sft: {e}") from e


def _check_paths(args: argparse.Namespace) -> None:
    """Before any training: --out can become a directory, and --model's files are sound (as ``armor run``
    checks them: config, the weights' headers, the tokenizer)."""
    from armor_core.loop.preflight import check_model

    out = Path(args.out)
    for above in (out, *out.parents):
        if above.exists():
            if not above.is_dir():
                raise ValueError(f"--out {args.out}: {above} is a file; give a directory to write the model to")
            break
    if args.model:
        check_model(args.model, trust_remote_code=args.trust_remote_code)


def _rows(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str]:
    """The train rows, the held-out rows and where they came from, as the arguments say."""
    import torch

    if args.data:
        load = load_traces if is_trace_file(args.data) else load_pairs
        train_rows = load(args.data)
        if args.val_data:
            return train_rows, load(args.val_data), args.data
        # hold out the last rows of a seeded shuffle
        perm = torch.randperm(len(train_rows), generator=torch.Generator().manual_seed(args.seed)).tolist()
        n_val = min(args.val_size, len(train_rows) // 10)
        val_rows = [train_rows[i] for i in perm[len(perm) - n_val :]]
        return [train_rows[i] for i in perm[: len(perm) - n_val]], val_rows, args.data
    params = parse_kwargs(args.task_kwarg, "--task-kwarg", "digits=3")
    train_rows = task_pairs(args.task, "train", args.train_size, args.seed, params)
    val_rows = (
        load_pairs(args.val_data) if args.val_data else task_pairs(args.task, "test", args.val_size, args.seed, params)
    )
    return train_rows, val_rows, f"task {args.task} {params or ''}".strip()


def _main(args: argparse.Namespace) -> int:
    import torch

    from armor_core.models.loading import load_model, load_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    for name in ("steps", "batch_size", "eval_every", "max_new_tokens", "train_size"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    _check_paths(args)
    train_rows, val_rows, source = _rows(args)
    if args.init:
        model, tokenizer = fresh_char_model(train_rows + val_rows, args.seed, TINY_ARCHS[args.init])
    else:
        tokenizer = load_tokenizer(args.model, trust_remote_code=args.trust_remote_code)
        model = load_model(args.model, trust_remote_code=args.trust_remote_code)
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"armor sft: {args.init or args.model} ({n_params / 1e6:.2f}M parameters), {len(train_rows)} train / "
        f"{len(val_rows)} held-out rows from {source}"
    )
    options = ("steps", "batch_size", "lr", "warmup_steps", "lr_schedule", "weight_decay", "eval_every")
    options += ("stop_at_accuracy", "max_new_tokens", "seed")
    with reward_passed(args.val_reward, args.val_reward_kwarg) as passed:  # None without --val-reward
        result = run_sft(
            model, tokenizer, train_rows, val_rows, passed=passed, **{k: getattr(args, k) for k in options}
        )
    summary = {"args": command_args(args), "parameters": n_params}
    summary.update({k: result[k] for k in ("steps", "val_accuracy", "history")})
    out = save_trained(args.out, model, tokenizer, "armor_sft.json", summary)
    print(
        f"saved to {out}: {result['steps']} steps in {result['seconds']:.1f}s, held-out greedy accuracy "
        f"{result['val_accuracy']:.3f}"
    )
    return 0
