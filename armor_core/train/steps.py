"""What both supervised trainers (``sft``, ``reward_model``) are built from, in one place: batches of row indices
drawn from seeded permutations, right-padding of token lists, evaluation with the model's mode restored, one
clipped AdamW step, and the directory a trainer writes (weights, tokenizer, a JSON record of the run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "batch_indices",
    "command_args",
    "eval_due",
    "evaluating",
    "optimizer_step",
    "pad_encoded",
    "save_trained",
]

#: every supervised step clips the gradient norm to this (both trainers train small models at high rates)
GRAD_CLIP = 1.0


def batch_indices(n_rows: int, batch_size: int, gen: torch.Generator) -> Iterator[list[int]]:
    """Endless batches of row indices, without replacement from permutations drawn from ``gen`` as
    they run out (a batch larger than the data takes one whole permutation)."""
    import torch

    order: list[int] = []
    while True:
        if len(order) < batch_size:
            order += torch.randperm(n_rows, generator=gen).tolist()
        batch, order = order[:batch_size], order[batch_size:]
        yield batch


def pad_encoded(
    encoded: Sequence[tuple[Sequence[int], int | Sequence[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, loss_mask), each (bs, T) long, right-padded with ``pad_id`` to the longest row.

    :param encoded: each row as (ids, targets): ``targets`` an int n (a pair: every token from the n-th on is a
        target) or a list of 0/1 as long as ``ids`` (a trace: its own mask).
    """
    import torch

    width = max(len(ids) for ids, _ in encoded)
    input_ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(encoded), width), dtype=torch.long)
    loss_mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for i, (ids, targets) in enumerate(encoded):
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        if isinstance(targets, int):
            loss_mask[i, targets : len(ids)] = 1
        else:
            loss_mask[i, : len(ids)] = torch.tensor(targets)
    return input_ids, attention, loss_mask


@contextlib.contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in eval mode without gradients for the block, then back in the mode it was in."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def eval_due(step: int, every: int, last: int) -> bool:
    """Whether held-out evaluation runs after ``step``: every ``every`` steps, and after the ``last``."""
    return step % every == 0 or step == last


def optimizer_step(
    loss: torch.Tensor,
    opt: torch.optim.Optimizer,
    params: Iterable[torch.nn.Parameter],
    sched: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> None:
    """Back-propagate ``loss``, clip the gradient norm of ``params`` to ``GRAD_CLIP``, step ``opt`` (and ``sched``)."""
    import torch

    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
    opt.step()
    if sched is not None:
        sched.step()


def command_args(args: argparse.Namespace) -> dict[str, Any]:
    """The command's own parsed arguments, as a run's record keeps them (argparse's bookkeeping left out)."""
    return {k: v for k, v in vars(args).items() if k not in ("func", "command", "rm_command", "version")}


def save_trained(
    out: str | Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    record_name: str,
    record: dict[str, Any],
) -> Path:
    """Write ``model`` and ``tokenizer`` as a Hugging Face directory ``out`` (made if missing), and ``record`` as
    JSON in ``out/record_name``; returns ``out`` as a path."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / record_name).write_text(json.dumps(record, indent=1) + "\n")
    return path
