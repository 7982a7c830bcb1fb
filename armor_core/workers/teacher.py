"""The teacher worker of on-policy distillation (built only when ``algorithm.distill.teacher`` is set).

A frozen causal LM in a worker group of its own (``distill.num_workers`` ranks, each pinned by the
ProcessIsolator to cores and devices of its own, like the critic), held in the compute dtype
(``model.dtype``: bfloat16 where the device allows). It scores the student's sampled responses the
way the actor's reference pass does: ``ResponseLogProbs`` (packed or prompt-sharing layouts, checked
against the padded forward once per layout; the chunked ``ResponseHead``, so no (tokens, vocabulary)
tensor) gives ``teacher_log_prob``, the teacher's log-prob of each sampled token. For
``mode=topk_forward_kl`` it also sends its ``k`` most likely tokens at each response position
(``teacher_topk_ids``, ``teacher_topk_log_probs``), from the padded forward's last hidden states
through its head in blocks of ``actor.logprob_chunk_tokens`` positions.

A teacher whose head has more rows than the student's (a vocabulary padded further, as Qwen2.5-7B's 152064
against 0.5B's 151936) keeps the student's rows only (``keep_rows``): both distributions are over the same ids.

Log-probs are at ``distill.teacher_temperature``, by default ``rollout.temperature`` (the student's), so the
two distributions compared are the one the rollout sampled from and the teacher at the same temperature.
No gradient, no state to checkpoint.

Under ``actor.strategy=fsdp2`` a teacher group of several ranks shards the teacher as the actor shards its policy
(``fully_shard`` per decoder layer): a rank holds 1/N of it, every forward is a collective, so each rank runs as
many micro-batches (stand-ins where it has fewer rows) and the layouts are checked by the ranks together.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from armor_core.config.schema import ArmorConfig, from_dict
from armor_core.dataproto.protocol import DataProto
from armor_core.workers.common import build_on_one_thread, isolate, micro_batches, quiet_transformers, seed_everything
from armor_core.workers.forward.lm_head import install_response_head
from armor_core.workers.forward.logprobs import ResponseLogProbs
from armor_core.workers.parallel.collectives import equal_micro_batches, init_distributed
from armor_core.workers.parallel.precision import autocast, compute_dtype
from armor_core.workers.parallel.strategy import reshard, wrap

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["TeacherWorker", "keep_rows", "teacher_top_k", "vocab_size"]


@torch.no_grad()
def teacher_top_k(
    model: PreTrainedModel, data: DataProto, rows: torch.Tensor, k: int, temperature: float, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log-probs (rows, R, k) float32, ids (rows, R, k) int64)``: the teacher's k most likely tokens at
    each response position of ``rows`` (padded layout), the head applied ``chunk`` positions at a time."""
    ids, attn, pos = (data[key][rows] for key in ("input_ids", "attention_mask", "position_ids"))
    R = data["responses"].shape[1]
    device = next(model.parameters()).device
    hidden = model.get_decoder()(
        input_ids=ids.to(device), attention_mask=attn.to(device), position_ids=pos.to(device), use_cache=False
    ).last_hidden_state[:, -R - 1 : -1]
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"the teacher ({type(model).__name__}) has no output layer to take its top-k from")
    flat = hidden.reshape(-1, hidden.shape[-1])
    lps, tops = [], []
    for s in range(0, flat.shape[0], max(1, chunk)):
        z = torch.nn.functional.linear(flat[s : s + chunk], head.weight, head.bias).float()
        if temperature and temperature != 1.0:
            z = z / temperature
        lp, top = z.log_softmax(-1).topk(min(k, z.shape[-1]), dim=-1)
        lps.append(lp)
        tops.append(top)
    shape = (len(ids), R, -1)
    return torch.cat(lps).view(shape).cpu(), torch.cat(tops).view(shape).cpu()


def vocab_size(directory: str | Path) -> int | None:
    """The rows of a model's output layer, from its ``config.json`` (a multimodal model's text config's); None
    where the file does not say (or there is none: a LoRA adapter)."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text(encoding="utf-8"))
    size = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def keep_rows(model: PreTrainedModel, rows: int) -> None:
    """Cut ``model``'s output layer to its first ``rows`` rows (a view of the weights, no copy), so its log-probs
    are normalised over, and its top-k drawn from, the ids the student has. A model pads its vocabulary past its
    tokenizer (Qwen2.5-0.5B to 151936 rows, 7B to 152064): the rows past the student's are never tokens the
    shared tokenizer produces, and a top-k id among them would be out of range for the student's gather."""
    head = model.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.out_features <= rows:
        return
    cut = torch.nn.Linear(head.in_features, rows, bias=head.bias is not None, device="meta")
    cut.weight = torch.nn.Parameter(head.weight[:rows], requires_grad=False)
    if head.bias is not None:
        cut.bias = torch.nn.Parameter(head.bias[:rows], requires_grad=False)
    model.set_output_embeddings(cut)


class TeacherWorker:
    def __init__(self, config: dict, rank: int = 0, world_size: int = 1, assignment: dict | None = None) -> None:
        from armor_core.models.loading import load_model, resolve_model_path

        self.cfg: ArmorConfig = from_dict(config)
        cfg, d = self.cfg, self.cfg.algorithm.distill
        self.rank, self.world_size = rank, world_size
        self.isolation = isolate(assignment, cfg, rank)
        built = build_on_one_thread()
        quiet_transformers()
        seed_everything(cfg.trainer.seed + 104729 + rank, cfg.trainer.deterministic)
        self.device = torch.device(cfg.trainer.device)
        self.compute_dtype = compute_dtype(cfg.model.dtype, self.device)
        self.sharded = cfg.actor.strategy == "fsdp2" and world_size > 1
        if self.sharded:
            init_distributed(self.device, rank, world_size)
        # never trained: held in the compute dtype, as the actor holds its reference copy
        trust = cfg.model.trust_remote_code
        assert d.teacher is not None  # the teacher worker is built only when algorithm.distill.teacher is set
        model = load_model(resolve_model_path(d.teacher), cfg.model.dtype, trust_remote_code=trust)
        # transformers annotates PreTrainedModel.to through a decorator pyright reads as taking the model itself
        self.model = model.to(self.device).eval().requires_grad_(False)  # pyright: ignore[reportArgumentType]
        student_rows = vocab_size(resolve_model_path(cfg.model.path))
        if student_rows is not None:  # a larger teacher scores over the student's ids (check_teacher refuses smaller)
            keep_rows(self.model, student_rows)
        self.chunk = cfg.actor.logprob_chunk_tokens
        if self.chunk and install_response_head(self.model):  # a head that is not a plain linear map: full logits
            self.chunk = 0
        if self.sharded:  # its forwards are collectives from here on; FSDP2 casts, as the actor's
            wrap(self.model, "fsdp2", world_size, self.device, self.compute_dtype)
        self.autocast = lambda enabled=not self.sharded: autocast(self.device, self.compute_dtype, enabled)
        self.collective = world_size if self.sharded else 1
        self.temperature = d.teacher_temperature or cfg.rollout.temperature
        self.logp = ResponseLogProbs(
            self.model,
            self.model,
            self.device,
            self.compute_dtype,
            self.temperature,
            self.chunk,
            self.autocast,
            lambda attn: micro_batches(attn.sum(-1), d.micro_batch_size),
            rank,
        )
        self.logp.who = f"teacher rank {rank}"
        self.logp.collective = self.collective
        built()

    def isolation_record(self) -> dict:
        return self.isolation

    def ping(self) -> dict:
        import os

        return {"rank": self.rank, "pid": os.getpid(), "params": sum(p.numel() for p in self.model.parameters())}

    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        t0 = time.perf_counter()
        d, mask = self.cfg.algorithm.distill, data["response_mask"]
        lp, _ = self.logp.all_rows(self.model, data, with_entropy=False, world_size=self.collective, routes=False)
        tensors = {"teacher_log_prob": lp * mask}
        if d.mode == "topk_forward_kl":
            parts = []
            chunks = [(rows, 1.0) for rows in micro_batches(data["attention_mask"].sum(-1), d.micro_batch_size)]
            with self.autocast():
                for rows, weight in equal_micro_batches(chunks, self.collective):  # stand-ins: as many forwards
                    top = teacher_top_k(self.model, data, rows, d.k, self.temperature, self.chunk or 1024)
                    if weight:
                        parts.append(top)
            tensors["teacher_topk_log_probs"] = torch.cat([p[0] for p in parts])
            tensors["teacher_topk_ids"] = torch.cat([p[1] for p in parts])
        if self.sharded:
            reshard(self.model)  # a forward without backward leaves FSDP2's root parameters gathered
        return DataProto.from_dict(
            tensors=tensors,
            meta_info={"metrics": {**self.logp.padding_metrics("teacher/"), "perf/worker_s": time.perf_counter() - t0}},
        )
