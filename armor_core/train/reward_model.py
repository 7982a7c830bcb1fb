"""A classifier reward model from preference pairs, with the Bradley-Terry loss (``armor rm train``, whose arguments
``armor_core.cli.rm`` parses).

    armor rm train --pairs prefs.jsonl --model builtin:arithmetic-tiny --out runs/rm

``--pairs`` is JSONL, one ``{"prompt", "chosen", "rejected"}`` a line. The model is the ``--model``
causal LM with a fresh one-output score head (``AutoModelForSequenceClassification``); each side is
scored on its prompt followed by its response, and the loss is ``-log sigmoid(r_chosen - r_rejected)``.
Held-out pairs (``--val-pairs``, or the last ``--val-fraction`` of a seeded shuffle) give the ranking
accuracy: the fraction with ``r_chosen > r_rejected``. The directory written (weights, tokenizer, and
``armor_rm.json``: accuracy, history, and the mean and standard deviation of the training pairs'
scores, which ``reward.model``'s ``normalize: true`` uses) is what ``reward.model.path`` loads.

LoRA (``--lora-rank R``, ``--lora-alpha``, ``--lora-targets``): adapters on the targeted linear layers
(``armor_core.models.lora.apply_lora``, as RL training builds them; ``all-linear``: every linear layer but the
score head), the base frozen, the fresh score head trained in full. The adapters are merged into the base
before saving, so the directory is a plain sequence classifier, loaded by ``reward.model`` like any other;
``armor_rm.json`` records the LoRA settings and the trainable parameter count.

Data parallel (``--nproc N``): N processes on this machine, torch.distributed over gloo, the model wrapped in
DDP. Every rank draws the same global batch of ``--batch-size`` pairs (which N must divide) and takes every
N-th pair; DDP averages the gradients, so a step equals one process's step on the whole batch, within float
tolerance (tested). Rank 0 evaluates, reports and writes the directory; each rank runs ``--threads`` torch
threads (default: this machine's cores split among the ranks).

Simplifications, on purpose: no FSDP (the model must fit one process), AdamW at a constant learning rate,
each batch padded to its longest row.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

from armor_core.train.jsonl import json_lines
from armor_core.train.steps import batch_indices, command_args, eval_due, evaluating, optimizer_step, save_trained

__all__ = ["add_lora", "load_preferences", "train_rank", "train_reward_model"]


def load_preferences(path: str | Path) -> list[dict[str, str]]:
    """The pairs of a JSONL file; a bad line is an error naming the file, the line and the key."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"--pairs {str(p)!r} is not a file; give a JSONL file of {{prompt, chosen, rejected}}")
    rows = []
    for lineno, raw in json_lines(p):
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
    from armor_core.rewards.model import score_texts

    with evaluating(model):
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
    rank: int = 0,
    world_size: int = 1,
) -> dict[str, Any]:
    """Fit ``model`` (a one-output sequence classifier, DDP-wrapped when ``world_size > 1``) on ``train``; rank 0
    evaluates on ``val`` as it goes. Each step draws the same ``batch_size`` pairs on every rank and takes every
    ``world_size``-th one. Only parameters that require grad are optimised (LoRA leaves the base frozen)."""
    import torch
    import torch.nn.functional as F

    inner = getattr(model, "module", model)  # DDP keeps the model in .module; evaluation needs no gradient sync
    params = [q for q in model.parameters() if q.requires_grad]
    batches = batch_indices(len(train), batch_size, torch.Generator().manual_seed(seed))
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    history, start = [], time.monotonic()
    for step in range(1, steps + 1):
        rows = [train[i] for i in next(batches)][rank::world_size]
        model.train()
        texts = [r["prompt"] + r["chosen"] for r in rows] + [r["prompt"] + r["rejected"] for r in rows]
        scores = _scores(model, tokenizer, texts, max_length)
        loss = -F.logsigmoid(scores[: len(rows)] - scores[len(rows) :]).mean()
        shown = _mean_over_ranks(loss.detach(), world_size)
        if not math.isfinite(shown):
            raise ValueError(f"the loss is {shown} at step {step}; lower --lr")
        # DDP averages the ranks' gradients in backward: the gradient of the whole batch's mean loss
        optimizer_step(loss, opt, params)
        if rank == 0 and eval_due(step, eval_every, steps):
            accuracy = _accuracy(inner, tokenizer, val, max_length)
            history.append({"step": step, "loss": round(shown, 4), "val_accuracy": accuracy})
            print(f"step {step}: loss {shown:.4f}, held-out accuracy {accuracy:.3f}", flush=True)
    inner.eval()
    if rank != 0:
        return {}
    mean, std = _score_moments(inner, tokenizer, train, max_length)
    return {
        "val_accuracy": history[-1]["val_accuracy"],
        "history": history,
        "score_mean": mean,
        "score_std": std,
        "seconds": time.monotonic() - start,
    }


def _score_moments(model: Any, tokenizer: Any, pairs: list[dict[str, str]], max_length: int) -> tuple[float, float]:
    """The mean and standard deviation (1 where it is 0) of the scores of every side of ``pairs``: what
    ``reward.model``'s ``normalize: true`` divides by."""
    from armor_core.rewards.model import score_texts

    with evaluating(model):
        texts = [r["prompt"] + r[side] for r in pairs for side in ("chosen", "rejected")]
        all_scores = score_texts(model, tokenizer, texts, 64, max_length)
    mean = sum(all_scores) / len(all_scores)
    return mean, math.sqrt(sum((s - mean) ** 2 for s in all_scores) / len(all_scores)) or 1.0


def _mean_over_ranks(value: Any, world_size: int) -> float:
    if world_size == 1:
        return value.item()
    import torch.distributed as dist

    total = value.clone()
    dist.all_reduce(total)
    return total.item() / world_size


def add_lora(model: Any, rank: int, alpha: float, targets: str, seed: int) -> Any:
    """``model`` with LoRA adapters on ``targets`` (``all-linear``: every linear layer but the score head), built as
    RL training builds them, and its score head trainable in full (it starts random: an adapter on it would leave
    the random weights in place)."""
    import torch

    from armor_core.models.lora import apply_lora

    heads = [name for name, m in model.named_children() if isinstance(m, torch.nn.Linear)]  # Qwen2: score
    if targets == "all-linear":
        names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        chosen = sorted(names - set(heads))
    else:
        chosen = [t.strip() for t in targets.split(",") if t.strip()]
        if set(chosen) & set(heads):
            raise ValueError(f"--lora-targets {targets!r} names the score head {heads}; it is trained in full")
    try:
        peft_model = apply_lora(model, rank, alpha, 0.0, chosen, seed, task="SEQ_CLS")
    except ValueError as e:
        raise ValueError(str(e).replace("model.lora_target_modules", "--lora-targets")) from None
    trained = [n for n, q in peft_model.named_parameters() if q.requires_grad and "lora_" not in n]
    if not trained:  # peft trains a copy of a head named score or classifier (modules_to_save)
        raise ValueError(f"{type(model).__name__}'s score head {heads} is not one peft trains in full under LoRA")
    return peft_model


def _train_and_held_out(args: argparse.Namespace) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The training pairs and the held-out ones: ``--val-pairs``, or the first ``--val-fraction`` of a seeded
    shuffle of ``--pairs``."""
    import torch

    pairs = load_preferences(args.pairs)
    if args.val_pairs:
        return pairs, load_preferences(args.val_pairs)
    perm = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(args.seed)).tolist()
    n_val = max(1, int(len(pairs) * args.val_fraction))
    return [pairs[i] for i in perm[n_val:]], [pairs[i] for i in perm[:n_val]]


def train_rank(rank: int, args: argparse.Namespace) -> None:
    """One process of ``armor rm train`` (``args``: its parsed arguments, checked by ``armor_core.cli.rm``): rank
    ``rank`` of ``args.nproc``; rank 0 writes the directory."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from armor_core.engine.isolation import detect_available_cpus
    from armor_core.models.loading import load_tokenizer, resolve_model_path
    from armor_core.rewards.model import RM_RECORD

    world = args.nproc
    torch.set_num_threads(args.threads or max(1, len(detect_available_cpus()) // world))
    torch.manual_seed(args.seed)  # the fresh score head: the same on every rank
    train, val = _train_and_held_out(args)
    directory = resolve_model_path(args.model)
    tokenizer = load_tokenizer(args.model)
    tokenizer.truncation_side = "left"
    model = AutoModelForSequenceClassification.from_pretrained(
        str(directory), num_labels=1, local_files_only=True, trust_remote_code=False
    )
    model.config.pad_token_id = tokenizer.pad_token_id
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"armor rm train: {args.model}, {len(train)} train / {len(val)} held-out pairs from {args.pairs}, "
        f"{world} process(es)")  # fmt: skip
    before = _accuracy(model, tokenizer, val, args.max_length) if rank == 0 else 0.0
    if args.lora_rank:
        model = add_lora(model, args.lora_rank, args.lora_alpha, args.lora_targets, args.seed)
    trainable = sum(q.numel() for q in model.parameters() if q.requires_grad)
    wrapped = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        from armor_core.workers.parallel.collectives import init_distributed

        init_distributed(torch.device("cpu"), rank, world)
        wrapped = DistributedDataParallel(model)
    result = train_reward_model(
        wrapped, tokenizer, train, val, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        weight_decay=args.weight_decay, eval_every=args.eval_every, max_length=args.max_length, seed=args.seed,
        rank=rank, world_size=world,
    )  # fmt: skip
    if world > 1:
        torch.distributed.barrier()  # no rank exits while a peer's gloo threads still talk to it
        torch.distributed.destroy_process_group()
    if rank != 0:
        return
    if args.lora_rank:
        model = model.merge_and_unload()  # a plain classifier: reward.model loads it as it is
    summary = {"args": command_args(args), "val_accuracy_before": before, "trainable_params": trainable, **result}
    out = save_trained(args.out, model, tokenizer, RM_RECORD, summary)
    say(
        f"saved to {out}: {args.steps} steps in {result['seconds']:.1f}s, held-out ranking accuracy "
        f"{before:.3f} -> {result['val_accuracy']:.3f}"
    )
