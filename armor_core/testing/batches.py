"""Batches laid out as ARMOR's stages see them, and a runner for data-parallel tests (``run_ranks``)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["left_padded_batch", "rollout_batch", "run_ranks", "shared_prompt_batch"]


def _rank_entry(rank: int, fn: Any, world: int, port: int, out_dir: str) -> None:
    import faulthandler
    import os
    import traceback

    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"})
    # a rank that dies in C++ (an abort, a segfault) raises nothing: its Python stack goes to the .crash file
    crash = open(os.path.join(out_dir, f"rank{rank}.crash"), "w")  # noqa: SIM115 - open until the process ends
    faulthandler.enable(file=crash, all_threads=True)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        torch.save(fn(rank, world), os.path.join(out_dir, f"rank{rank}.pt"))
        # no rank leaves while a peer's gloo threads still talk to it: a rank that exits right after the last
        # collective can abort its peer at exit ("terminate called without an active exception")
        dist.barrier()
    except BaseException:
        with open(os.path.join(out_dir, f"rank{rank}.err"), "w") as fh:
            fh.write(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Any, world: int, out_dir: str | Any) -> list[Any]:
    """Run ``fn(rank, world)`` in ``world`` processes joined in one gloo group; return each rank's result.

    ``fn`` must be importable (a module-level function); its results travel through ``torch.save``
    files in ``out_dir``. A failing rank's traceback is raised here as an AssertionError, so a
    data-parallel test reads like a single-process one::

        def _step(rank, world):
            worker = ActorWorker(config, rank=rank, world_size=world)
            return worker.update_actor(share[rank], step=1)

        metrics = run_ranks(_step, 2, tmp_path)
    """
    import socket
    from pathlib import Path

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(out_dir)
    try:
        mp.spawn(_rank_entry, args=(fn, world, port, str(out)), nprocs=world, join=True)
    except Exception as e:
        told = [p.read_text() for p in sorted(out.glob("rank*.err"))]
        told += [f"{p.name}:\n{p.read_text()}" for p in sorted(out.glob("rank*.crash")) if p.stat().st_size]
        raise AssertionError(f"a rank failed ({e}):\n" + "\n".join(told)) from None
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]


def left_padded_batch(ids: list[list[int]], pad: int = 0) -> Any:
    """A rollout backend's input: the token-id rows left-padded with ``pad`` to one width, with
    ``attention_mask`` and ``position_ids`` (0 on padding), a ``uid`` per row and a ``meta_info``
    entry that a backend must carry over."""
    from armor_core.dataproto.protocol import DataProto

    width = max(len(r) for r in ids)
    input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in ids])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        tensors={"input_ids": input_ids, "attention_mask": mask, "position_ids": pos},
        non_tensors={"uid": [f"p{i}" for i in range(len(ids))]},
        meta_info={"note": "kept"},
    )


def rollout_batch(
    prompt_lens: list[int], resp_lens: list[int], P: int = 6, R: int = 5, vocab: int = 23, seed: int = 0, pad: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random batch laid out like the rollout's output: prompts left-padded to ``P`` tokens, then
    responses right-padded to ``R``. Returns ``(input_ids, attention_mask, position_ids, responses)``;
    positions after a short response keep counting, as the rollout writes them."""
    g = torch.Generator().manual_seed(seed)
    bs = len(prompt_lens)
    ids = torch.randint(3, vocab, (bs, P + R), generator=g)
    attn = torch.zeros(bs, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, resp_lens)):
        attn[i, P - p : P] = 1
        attn[i, P : P + r] = 1
    ids = torch.where(attn.bool(), ids, torch.full_like(ids, pad))
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    pos[:, P:] = pos[:, P - 1 : P] + torch.arange(1, R + 1)
    return ids, attn, pos, ids[:, P:].clone()


def shared_prompt_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A :func:`rollout_batch` of 12 rows where four prompts repeat 2-4 times each, in shuffled
    order (as GRPO's groups after a shuffle), with responses of mixed lengths, one of them empty."""
    prompt_of = [0, 1, 0, 2, 3, 1, 0, 2, 3, 3, 0, 1]
    prompt_lens = [6, 3, 1, 5]
    resp_lens = [5, 1, 3, 0, 5, 2, 4, 5, 1, 3, 2, 4]
    ids, attn, pos, resp = rollout_batch([prompt_lens[g] for g in prompt_of], resp_lens, seed=seed)
    first = {g: prompt_of.index(g) for g in set(prompt_of)}
    for i, g in enumerate(prompt_of):
        ids[i, :6] = ids[first[g], :6]
    return ids, attn, pos, resp
