"""``armor rm train``: a classifier reward model from preference pairs, with the Bradley-Terry loss.

    armor rm train --pairs prefs.jsonl --model builtin:arithmetic-tiny --out runs/rm

``--pairs`` is JSONL, one ``{"prompt", "chosen", "rejected"}`` a line. The model is the ``--model``
causal LM with a fresh one-output score head (``AutoModelForSequenceClassification``); each side is
scored on its prompt followed by its response, and the loss is ``-log sigmoid(r_chosen - r_rejected)``.
Held-out pairs (``--val-pairs``, or the last ``--val-fraction`` of a seeded shuffle) give the ranking
accuracy: the fraction with ``r_chosen > r_rejected``. The directory written (weights, tokenizer, and
``armor_rm.json``: accuracy, history, and the mean and standard deviation of the training pairs'
scores, which ``reward.model``'s ``normalize: true`` uses) is what ``reward.model.path`` loads.

Simplifications, on purpose: one process (no DDP, FSDP or LoRA yet), AdamW at a constant learning rate,
each batch padded to its longest row.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "load_preferences", "main", "train_reward_model"]


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
    t.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    t.set_defaults(func=main)


def load_preferences(path: str | Path) -> list[dict[str, str]]:
    """The pairs of a JSONL file; a bad line is an error naming the file, the line and the key."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--pairs {str(p)!r} is not a file; give a JSONL file of {{prompt, chosen, rejected}}")
    rows = []
    with open(p, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{p}, line {lineno}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(raw, dict):
                raise ValueError(f"{p}, line {lineno}: expected an object {{prompt, chosen, rejected}}")
            for key in ("prompt", "chosen", "rejected"):
                if not isinstance(raw.get(key), str):
                    raise ValueError(f"{p}, line {lineno}: '{key}' must be text, got {raw.get(key)!r}")
            rows.append({k: raw[k] for k in ("prompt", "chosen", "rejected")})
    if len(rows) < 2:
        raise ValueError(f"{p}: {len(rows)} pair(s); training needs at least 2")
    return rows


def _scores(model: Any, tokenizer: Any, texts: list[str], max_length: int) -> Any:
    enc = tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=max_length)
    return model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits[:, 0].float()


def _accuracy(model: Any, tokenizer: Any, pairs: list[dict[str, str]], max_length: int) -> float:
    import torch

    from armor_core.rewards.model import score_texts

    with torch.no_grad():
        chosen = score_texts(model, tokenizer, [r["prompt"] + r["chosen"] for r in pairs], 64, max_length)
        rejected = score_texts(model, tokenizer, [r["prompt"] + r["rejected"] for r in pairs], 64, max_length)
    return sum(c > r for c, r in zip(chosen, rejected)) / len(pairs)


def train_reward_model(
    model: Any,
    tokenizer: Any,
    train: list[dict[str, str]],
    val: list[dict[str, str]],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    weight_decay: float = 0.0,
    eval_every: int = 50,
    max_length: int = 512,
    seed: int = 0,
) -> dict[str, Any]:
    """Fit ``model`` (a one-output sequence classifier) on ``train``; the held-out accuracy as it goes."""
    import torch
    import torch.nn.functional as F

    from armor_core.rewards.model import score_texts

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    history, start = [], time.monotonic()
    order: list[int] = []
    for step in range(1, steps + 1):
        if len(order) < batch_size:
            order += torch.randperm(len(train), generator=gen).tolist()
        rows = [train[i] for i in order[:batch_size]]
        del order[:batch_size]
        model.train()
        texts = [r["prompt"] + r["chosen"] for r in rows] + [r["prompt"] + r["rejected"] for r in rows]
        scores = _scores(model, tokenizer, texts, max_length)
        loss = -F.logsigmoid(scores[: len(rows)] - scores[len(rows) :]).mean()
        if not torch.isfinite(loss):
            raise ValueError(f"the loss is {loss.item()} at step {step}; lower --lr")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % eval_every == 0 or step == steps:
            model.eval()
            accuracy = _accuracy(model, tokenizer, val, max_length)
            history.append({"step": step, "loss": round(loss.item(), 4), "val_accuracy": accuracy})
            print(f"step {step}: loss {loss.item():.4f}, held-out accuracy {accuracy:.3f}", flush=True)
    model.eval()
    with torch.no_grad():
        texts = [r["prompt"] + r[side] for r in train for side in ("chosen", "rejected")]
        all_scores = score_texts(model, tokenizer, texts, 64, max_length)
    mean = sum(all_scores) / len(all_scores)
    std = math.sqrt(sum((s - mean) ** 2 for s in all_scores) / len(all_scores)) or 1.0
    return {
        "val_accuracy": history[-1]["val_accuracy"],
        "history": history,
        "score_mean": mean,
        "score_std": std,
        "seconds": time.monotonic() - start,
    }


def main(args: argparse.Namespace) -> int:
    from armor_core.errors import UserFacingError

    try:
        return _main(args)
    except ValueError as e:
        raise UserFacingError(f"armor rm train: {e}") from e


def _main(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForSequenceClassification

    from armor_core.models.loading import load_tokenizer, resolve_model_path
    from armor_core.rewards.model import RM_RECORD

    for name in ("steps", "batch_size", "eval_every", "max_length"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if not 0 < args.val_fraction < 1 and not args.val_pairs:
        raise ValueError(f"--val-fraction={args.val_fraction} must lie between 0 and 1")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out} is a file; give a directory to write the reward model to")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    pairs = load_preferences(args.pairs)
    if args.val_pairs:
        train, val = pairs, load_preferences(args.val_pairs)
    else:
        perm = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(args.seed)).tolist()
        n_val = max(1, int(len(pairs) * args.val_fraction))
        train, val = [pairs[i] for i in perm[n_val:]], [pairs[i] for i in perm[:n_val]]
    directory = resolve_model_path(args.model)
    tokenizer = load_tokenizer(args.model)
    tokenizer.truncation_side = "left"
    model = AutoModelForSequenceClassification.from_pretrained(
        str(directory), num_labels=1, local_files_only=True, trust_remote_code=False
    )
    model.config.pad_token_id = tokenizer.pad_token_id
    print(f"armor rm train: {args.model}, {len(train)} train / {len(val)} held-out pairs from {args.pairs}")
    before = _accuracy(model.eval(), tokenizer, val, args.max_length)
    result = train_reward_model(
        model,
        tokenizer,
        train,
        val,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        weight_decay=args.weight_decay,
        eval_every=args.eval_every,
        max_length=args.max_length,
        seed=args.seed,
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record = {k: v for k, v in vars(args).items() if k not in ("func", "command", "rm_command", "version")}
    summary = {"args": record, "val_accuracy_before": before, **result}
    (out / RM_RECORD).write_text(json.dumps(summary, indent=1) + "\n")
    print(
        f"saved to {out}: {args.steps} steps in {result['seconds']:.1f}s, held-out ranking accuracy "
        f"{before:.3f} -> {result['val_accuracy']:.3f}"
    )
    return 0
