"""Pieces shared by the actor and critic workers: seeding, log-probs from logits, batching."""

from __future__ import annotations

import os
import random
from typing import Any, Iterator

import numpy as np
import torch

__all__ = ["seed_everything", "response_log_probs", "iter_micro_batches", "scalar"]


def isolate(assignment: dict | None, cfg: Any, rank: int) -> dict:
    """First thing in a worker: take the cores and GPUs the ProcessIsolator planned for it."""
    from armor_core.isolation import Assignment, apply_assignment

    if assignment is not None:
        return apply_assignment(Assignment(assignment["group"], assignment["rank"], tuple(assignment["cpus"]), tuple(assignment["gpus"]), assignment.get("node", "")), cfg.trainer.seed)
    threads = max(1, int(cfg.engine.cpus_per_worker or 1))
    torch.set_num_threads(threads)
    return {"pid": os.getpid(), "rank": rank, "threads": threads, "isolated": False}


def quiet_transformers() -> None:
    """No per-worker progress bars for loading a model: they interleave on the driver's console."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def seed_everything(seed: int, deterministic: bool = True) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def response_log_probs(logits: torch.Tensor, responses: torch.Tensor, temperature: float, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of ``responses`` (bs, R) under ``logits`` (bs, R, V) / temperature.

    Dividing by the sampling temperature makes the trainer's distribution the one the rollout
    sampled from, so the PPO ratio compares like with like. Computed in float32 whatever the model
    dtype: bf16 log-softmax loses ~3 significant digits, enough to bias the ratio.
    """
    logits = logits.float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    logz = torch.logsumexp(logits, dim=-1)
    lp = torch.gather(logits, -1, responses.unsqueeze(-1)).squeeze(-1) - logz
    ent = None
    if with_entropy:
        probs = torch.softmax(logits, dim=-1)
        ent = logz - (probs * logits).sum(-1)
    return lp, ent


def forward_response_logits(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_length: int) -> torch.Tensor:
    """Logits that predict each response token: positions [-R-1, -1) of the full sequence."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    return out.logits[:, -response_length - 1 : -1, :]


def iter_micro_batches(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def scalar(x: Any) -> float:
    return float(x.detach().float().item()) if isinstance(x, torch.Tensor) else float(x)
