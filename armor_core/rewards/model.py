"""Rewards from a classifier reward model: ``reward.model``, a local Hugging Face directory of a
sequence-classification model with one output (a Qwen reward model, or one ``armor rm train`` wrote).

    reward:
      model:
        - {path: runs/rm, data_sources: [chat], domain: rm, normalize: true, rule: arithmetic}

Each entry is a batched domain (``RewardDomain.batch_fn``). ``placement: pool`` (the default) scores it in the
reward pool's worker processes: the worker loads the model once (its ``warmup``, outside ``reward.timeout_s``),
then scores a batch's rows ``batch_size`` at a time, each row the prompt followed by the response, cut to its
last ``max_length`` tokens, on ``threads`` torch threads. ``placement: worker`` gives the model a Ray worker of
its own (``armor_core.rewards.placement``): its own cores and, with ``engine.gpus_per_worker``, GPUs under the
ProcessIsolator, counted in the run's isolation plan; the manager sends it each batch's rows in one call, under
``reward.timeout_s``. ``dtype``: ``auto`` (the default: bfloat16 on a GPU that has it, float32 on a CPU, which
the pool always is), float32, bfloat16 or float16. ``normalize``: false (the raw score), true (standardised by
the score mean and standard deviation ``armor rm train`` recorded in the directory's ``armor_rm.json``), or
``{mean, std}``.

``rule``: a rule-based domain that also scores these rows, at weight 0 (it does not move the reward):
the gap ``reward/model_minus_rule`` (the model's score minus the rule's, mean over rows) is logged each
step and plotted by ``armor report``, so reward hacking shows as a rising gap.

Not yet: FSDP for a reward model too large for one worker's devices (a worker holds the whole model).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from armor_core.config.schema import ConfigError
from armor_core.interfaces import RewardResult
from armor_core.rewards.batch import OneRowFromBatch
from armor_core.rewards.entries import Entries
from armor_core.rewards.placement import placed

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["ClassifierReward", "PLACEMENTS", "RM_RECORD", "load_models", "model_paths", "resolve_dtype"]

PLACEMENTS = ("pool", "worker")

#: what ``armor rm train`` writes beside the weights: accuracy, and the score statistics ``normalize`` uses
RM_RECORD = "armor_rm.json"
_DEFAULTS = {
    "domain": "rm",
    "data_sources": [],
    "batch_size": 32,
    "max_length": 2048,
    "dtype": "auto",
    "threads": 1,
    "placement": "pool",
    "normalize": False,
    "rule": None,
    "requires_ground_truth": False,
}
_LOADED: dict[tuple, tuple[Any, Any]] = {}  # per process: (path, dtype) -> (model, tokenizer)


class ClassifierReward(OneRowFromBatch):
    """The ``batch_fn`` of a ``reward.model`` domain; pickled by its settings, the model loaded in the worker."""

    def __init__(self, path: str, *, batch_size: int, max_length: int, dtype: str, threads: int,
                 mean: float, std: float) -> None:  # fmt: skip
        self.path, self.batch_size, self.max_length, self.dtype = path, batch_size, max_length, dtype
        self.threads, self.mean, self.std = threads, mean, std
        self.device = "cpu"  # a reward-model worker with a GPU sets "cuda" before it loads

    def __repr__(self) -> str:
        return f"ClassifierReward({self.path})"

    def load(self) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        dtype = resolve_dtype(self.dtype, self.device)
        key = (self.path, dtype, self.device)
        if key not in _LOADED:
            import torch
            from transformers import AutoModelForSequenceClassification

            from armor_core.models.loading import load_tokenizer

            torch.set_num_threads(self.threads)
            tokenizer = load_tokenizer(self.path)
            tokenizer.truncation_side = "left"  # keep the end of a long row: the response
            model = AutoModelForSequenceClassification.from_pretrained(
                self.path, dtype=getattr(torch, dtype), local_files_only=True, trust_remote_code=False
            )
            model.config.pad_token_id = tokenizer.pad_token_id
            _LOADED[key] = (model.to(self.device).eval(), tokenizer)
        return _LOADED[key]

    def score_batch(
        self,
        prompts: Sequence[str],
        responses: Sequence[str],
        ground_truths: Sequence[Any],
        extras: Sequence[Mapping[str, Any]],
    ) -> list[RewardResult | Exception]:
        texts = [p + r for p, r in zip(prompts, responses)]
        scores = score_texts(*self.load(), texts, self.batch_size, self.max_length)
        return [RewardResult((s - self.mean) / self.std, {"raw": s}) for s in scores]


def score_texts(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], batch_size: int, max_length: int
) -> list[float]:
    """The model's one logit for each text, ``batch_size`` texts a forward pass."""
    import torch

    out: list[float] = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            enc = tokenizer(
                list(texts[start : start + batch_size]),
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=max_length,
            )
            device = next(model.parameters()).device
            ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
            logits = model(input_ids=ids, attention_mask=mask).logits
            out += logits[:, 0].float().tolist()
    return out


def resolve_dtype(name: str, device: str) -> str:
    """``auto``: bfloat16 on a CUDA device that computes in it, else float32 (a CPU's bfloat16 matmuls are slow
    on most cores, and the pool's numbers were measured in float32); any other name as given."""
    if name != "auto":
        return name
    if device.startswith("cuda"):
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "float32"


def _normalizer(entry: Mapping[str, Any], path: Path, at: str) -> tuple[float, float]:
    spec = entry["normalize"]
    if spec is False or spec is None:
        return 0.0, 1.0
    if spec is True:
        record = path / RM_RECORD
        try:
            stats = json.loads(record.read_text())
            spec = {"mean": stats["score_mean"], "std": stats["score_std"]}
        except (OSError, ValueError, KeyError):
            raise ConfigError(
                f"{at}.normalize=true needs {record} with score_mean and score_std (armor rm train writes it); "
                "give {mean, std} or normalize=false"
            ) from None
    if not isinstance(spec, Mapping) or not all(isinstance(spec.get(k), (int, float)) for k in ("mean", "std")):
        raise ConfigError(f"{at}.normalize={spec!r}: expected true, false or {{mean: <number>, std: <number>}}")
    if not spec["std"] > 0 or not math.isfinite(spec["mean"]):
        raise ConfigError(f"{at}.normalize: std must be positive and mean finite, got {dict(spec)}")
    return float(spec["mean"]), float(spec["std"])


def model_paths(value: Any, where: str = "reward.model") -> list[tuple[str, str]]:
    """``(config key, directory)`` of each entry of ``reward.model``, for the checks ``armor run`` makes at start
    (``loop.preflight.check_reward_models``). :raises ConfigError: an entry that is not a mapping with ``path``."""
    return [(f"{at}.path", str(entry["path"])) for at, entry in Entries(value, where, _DEFAULTS, ["path"], [])]


def load_models(value: Any, known: Sequence[str], where: str = "reward.model") -> tuple[dict, dict, dict]:
    """The domains of ``reward.model`` (a mapping or a list): ``({domain: RewardDomain}, {data_source: domain},
    {domain: rule domain})``. The directory is checked here (config, weights, tokenizer); the weights load
    in the reward worker. :raises ConfigError: naming the entry and what is wrong."""
    from armor_core.models.loading import resolve_model_path

    entries = Entries(value, where, _DEFAULTS, ["path"], known)
    rules: dict[str, str] = {}
    for at, entry in entries:
        try:
            given = str(entry["path"])
            path = resolve_model_path(given if given.startswith("builtin:") else Path(given).expanduser().resolve())
            kind = json.loads((path / "config.json").read_text()).get("architectures") or []
        except Exception as e:  # not a directory, no config or tokenizer, a config that is not JSON
            raise ConfigError(f"{at}.path: {e}") from None
        if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
            raise ConfigError(f"{at}.path: {path} holds no weights (*.safetensors)")
        if not any(str(a).endswith("ForSequenceClassification") for a in kind):
            raise ConfigError(
                f"{at}.path: {path} holds {', '.join(kind) or 'no architecture'}, not a sequence-classification "
                "model (a reward model); armor rm train makes one"
            )
        entries.whole(entry, at, ["batch_size", "max_length", "threads"])
        if entry["dtype"] not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"{at}.dtype={entry['dtype']!r}: expected auto, float32, bfloat16 or float16")
        if entry["placement"] not in PLACEMENTS:
            raise ConfigError(f"{at}.placement={entry['placement']!r}: expected pool or worker")
        mean, std = _normalizer(entry, path, at)
        scorer = ClassifierReward(
            str(path),
            batch_size=entry["batch_size"],
            max_length=entry["max_length"],
            dtype=entry["dtype"],
            threads=entry["threads"],
            mean=mean,
            std=std,
        )
        domain = placed(
            scorer, entry["placement"], bool(entry["requires_ground_truth"]), f"the reward model at {path}", at
        )
        entries.add(at, entry, domain)
        if entry["rule"] is not None:
            rules[str(entry["domain"])] = str(entry["rule"])
    return entries.domains, entries.routes, rules
